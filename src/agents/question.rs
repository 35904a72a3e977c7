//! An agent's questions to the user (OpenCode's `question` tool) as an ACP elicitation form, and the form's answer
//! back as the agent's answers: pure, so both directions are tested here.

use std::collections::BTreeMap;

use agent_client_protocol::v1::schema::{
    CreateElicitationRequest, ElicitationContentValue, ElicitationFormMode, ElicitationSchema, ElicitationSessionScope,
    EnumOption, MultiSelectPropertySchema, StringPropertySchema,
};

/// What the agent asks, and how it wants the answers.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct QuestionAsk {
    /// The agent's id of the request, to answer it by.
    pub request_id: String,
    /// The card of the tool that asks, if the editor knows one.
    pub tool_call_id: Option<String>,
    /// The questions, in order; the answer is one list of labels per question.
    pub questions: Vec<Question>,
}

/// One question.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Question {
    /// The whole question.
    pub question: String,
    /// A short label for it.
    pub header: String,
    /// The choices: (label, what it means). The label is the answer.
    pub options: Vec<(String, String)>,
    /// Whether several choices may be picked.
    pub multiple: bool,
    /// Whether an answer of one's own may be typed instead.
    pub custom: bool,
}

/// The field of the form for question `index`'s choice, and for an answer of one's own.
fn fields(index: usize) -> (String, String) {
    (format!("q{index}"), format!("q{index}_own"))
}

/// The form the editor shows for `ask` in `session`: per question a choice (one, or several), and a free-text field
/// where the agent takes an answer of one's own; a choice is required only where no own answer may stand for it.
pub fn elicitation(session: &str, agent: &str, ask: &QuestionAsk) -> CreateElicitationRequest {
    let mut schema = ElicitationSchema::new();
    for (index, question) in ask.questions.iter().enumerate() {
        let (choice, own) = fields(index);
        let options: Vec<EnumOption> = question
            .options
            .iter()
            .map(|(label, description)| {
                EnumOption::new(label.clone(), label.clone())
                    .description(Some(description.clone()).filter(|d| !d.is_empty()))
            })
            .collect();
        schema = if question.multiple {
            schema.property(
                choice,
                MultiSelectPropertySchema::titled(options)
                    .title(question.header.clone())
                    .description(question.question.clone()),
                !question.custom,
            )
        } else {
            schema.property(
                choice,
                StringPropertySchema::new()
                    .title(question.header.clone())
                    .description(question.question.clone())
                    .one_of(options),
                !question.custom,
            )
        };
        if question.custom {
            let field = StringPropertySchema::new()
                .title(format!("{}: your own answer", question.header))
                .description("Instead of a choice above".to_string());
            schema = schema.property(own, field, false);
        }
    }
    let mut scope = ElicitationSessionScope::new(session.to_string());
    if let Some(id) = &ask.tool_call_id {
        scope = scope.tool_call_id(agent_client_protocol::v1::schema::ToolCallId::new(id.clone()));
    }
    let questions: Vec<&str> = ask.questions.iter().map(|question| question.question.as_str()).collect();
    CreateElicitationRequest::new(
        ElicitationFormMode::new(scope, schema),
        format!("{agent} asks: {}", questions.join(" ")),
    )
}

/// The agent's answers from the form's content: per question an answer of one's own when one was typed, else the
/// choices picked (none when nothing was).
pub fn answers(ask: &QuestionAsk, content: &BTreeMap<String, ElicitationContentValue>) -> Vec<Vec<String>> {
    ask.questions
        .iter()
        .enumerate()
        .map(|(index, question)| {
            let (choice, own) = fields(index);
            if question.custom
                && let Some(ElicitationContentValue::String(text)) = content.get(&own)
                && !text.trim().is_empty()
            {
                return vec![text.trim().to_string()];
            }
            match content.get(&choice) {
                Some(ElicitationContentValue::String(label)) if !label.is_empty() => vec![label.clone()],
                Some(ElicitationContentValue::StringArray(labels)) => labels.clone(),
                _ => Vec::new(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ask() -> QuestionAsk {
        QuestionAsk {
            request_id: "que_1".into(),
            tool_call_id: Some("call_1".into()),
            questions: vec![
                Question {
                    question: "Which colour?".into(),
                    header: "Colour".into(),
                    options: vec![("Red".into(), "Warm".into()), ("Blue".into(), String::new())],
                    multiple: false,
                    custom: true,
                },
                Question {
                    question: "Which sizes?".into(),
                    header: "Sizes".into(),
                    options: vec![("S".into(), "Small".into()), ("L".into(), "Large".into())],
                    multiple: true,
                    custom: false,
                },
            ],
        }
    }

    #[test]
    fn the_form_offers_each_questions_choices_and_an_own_answer_where_the_agent_takes_one() {
        let request = serde_json::to_value(elicitation("sess_1", "OpenCode", &ask())).unwrap();
        assert_eq!(
            request,
            json!({
                "mode": "form",
                "sessionId": "sess_1",
                "toolCallId": "call_1",
                "requestedSchema": {
                    "type": "object",
                    "properties": {
                        "q0": {"type": "string", "title": "Colour", "description": "Which colour?", "oneOf": [
                            {"const": "Red", "title": "Red", "description": "Warm"},
                            {"const": "Blue", "title": "Blue"}
                        ]},
                        "q0_own": {"type": "string", "title": "Colour: your own answer", "description": "Instead of a choice above"},
                        "q1": {"type": "array", "title": "Sizes", "description": "Which sizes?", "items": {"anyOf": [
                            {"const": "S", "title": "S", "description": "Small"},
                            {"const": "L", "title": "L", "description": "Large"}
                        ]}}
                    },
                    "required": ["q1"]
                },
                "message": "OpenCode asks: Which colour? Which sizes?"
            })
        );
    }

    #[test]
    fn an_own_answer_stands_for_the_choice_and_a_missing_answer_is_empty() {
        let content = |pairs: Vec<(&str, ElicitationContentValue)>| -> BTreeMap<String, ElicitationContentValue> {
            pairs.into_iter().map(|(key, value)| (key.to_string(), value)).collect()
        };
        let picked = content(vec![("q0", "Blue".into()), ("q1", vec!["S", "L"].into())]);
        assert_eq!(answers(&ask(), &picked), [vec!["Blue".to_string()], vec!["S".to_string(), "L".to_string()]]);
        let own = content(vec![("q0", "Blue".into()), ("q0_own", " Green ".into()), ("q1", vec!["L"].into())]);
        assert_eq!(answers(&ask(), &own), [vec!["Green".to_string()], vec!["L".to_string()]]);
        assert_eq!(answers(&ask(), &content(vec![("q0_own", "  ".into())])), [Vec::<String>::new(), Vec::new()]);
    }
}
