//! Turning ACP prompt content into what the CLI reads on stdin, plus attached files and a title.

use std::path::PathBuf;

use agent_client_protocol::v1::schema::{ContentBlock, EmbeddedResourceResource};
use base64::Engine;

pub use crate::agents::host::RenderedPrompt;

/// Renders prompt blocks. Text and links stay inline in their order (Zed splits "fix @a.rs now" into
/// three blocks); embedded resources are referenced inline and their contents appended as context, so
/// the request reads naturally. A single text block reaches the CLI byte for byte.
pub fn render(blocks: &[ContentBlock], accepts_images: bool) -> RenderedPrompt {
    render_taking(blocks, accepts_images, false)
}

/// [`render`] for an agent that may take audio (`accepts_audio`): its audio is not left out here (the agent's
/// service passes it on as it is, or says it left it out).
pub fn render_taking(blocks: &[ContentBlock], accepts_images: bool, accepts_audio: bool) -> RenderedPrompt {
    let mut rendered = RenderedPrompt::default();
    let mut context = Vec::new();
    for block in blocks {
        match block {
            ContentBlock::Text(text) => rendered.text.push_str(&text.text),
            ContentBlock::ResourceLink(link) => rendered.text.push_str(&uri_to_path(&link.uri)),
            ContentBlock::Resource(resource) => match &resource.resource {
                EmbeddedResourceResource::TextResourceContents(contents) => {
                    let path = uri_to_path(&contents.uri);
                    rendered.text.push_str(&path);
                    context.push(format!("<context ref=\"{path}\">\n{}\n</context>", contents.text));
                }
                EmbeddedResourceResource::BlobResourceContents(contents) => {
                    rendered.text.push_str(&uri_to_path(&contents.uri));
                }
                _ => rendered.dropped.push("an unknown kind of embedded resource".into()),
            },
            ContentBlock::Image(image) => {
                let bytes = base64::engine::general_purpose::STANDARD.decode(image.data.as_bytes());
                match bytes {
                    Ok(bytes) if accepts_images => {
                        let name = format!("image-{}.{}", rendered.images.len() + 1, extension(&image.mime_type));
                        rendered.images.push((name, bytes));
                    }
                    Ok(_) => rendered.dropped.push(format!("an image ({})", image.mime_type)),
                    Err(_) => rendered.dropped.push("an image whose data is not valid base64".into()),
                }
            }
            ContentBlock::Audio(_) if accepts_audio => {}
            ContentBlock::Audio(_) => rendered.dropped.push("audio".into()),
            _ => rendered.dropped.push("an unknown content block".into()),
        }
    }
    if !context.is_empty() {
        rendered.text.push_str("\n\n");
        rendered.text.push_str(&context.join("\n\n"));
    }
    rendered
}

/// When the prompt starts with `/name` and `name` is one of the CLI's commands, takes the command off the
/// text (which keeps its arguments) and returns its name.
pub fn split_command<'a>(text: &mut String, commands: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let rest = text.strip_prefix('/')?;
    let name_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    let name = &rest[..name_end];
    if name.is_empty() || !commands.into_iter().any(|command| command == name) {
        return None;
    }
    let name = name.to_string();
    let arguments = rest[name_end..].trim_start().to_string();
    *text = arguments;
    Some(name)
}

/// A title for the history list: the first line of the prompt's text, shortened.
pub fn title(blocks: &[ContentBlock]) -> Option<String> {
    let text: String = blocks
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect();
    let line = text.lines().map(str::trim).find(|line| !line.is_empty())?;
    const MAX: usize = 80;
    if line.chars().count() <= MAX {
        Some(line.to_string())
    } else {
        let short: String = line.chars().take(MAX - 1).collect();
        Some(format!("{}…", short.trim_end()))
    }
}

/// The earlier turns of a session as plain text, newest kept when over `limit` characters: what a fresh CLI
/// conversation needs to carry on when the old one is lost. Prompts and the agent's answers only.
pub fn transcript(turns: &[(crate::store::TurnRecord, Vec<serde_json::Value>)], limit: usize) -> String {
    let mut parts: Vec<String> = Vec::new();
    for (turn, updates) in turns {
        let blocks: Vec<ContentBlock> = serde_json::from_value(turn.prompt.clone()).unwrap_or_default();
        let asked = render(&blocks, false).text;
        let answered: String = updates
            .iter()
            .filter(|update| update["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|update| update["content"]["text"].as_str())
            .filter(|text| !super::is_note(text))
            .collect();
        parts.push(format!("User:\n{}\n\nAssistant:\n{}", asked.trim(), answered.trim()));
    }
    let mut kept: Vec<String> = Vec::new();
    let mut size = 0;
    for part in parts.into_iter().rev() {
        if size + part.len() > limit && !kept.is_empty() {
            break;
        }
        size += part.len();
        kept.push(part);
    }
    if kept.is_empty() {
        return String::new();
    }
    kept.reverse();
    let mut text = kept.join("\n\n---\n\n");
    if text.len() > limit {
        let start = text.len() - limit;
        let start = (start..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
        text = format!("…{}", &text[start..]);
    }
    format!(
        "<earlier-conversation>\nThe conversation so far was lost; here is its transcript. Continue from it.\n\n{text}\n</earlier-conversation>"
    )
}

/// `file:///a/b` becomes `/a/b` (percent-decoded); anything else stays a URI.
fn uri_to_path(uri: &str) -> String {
    match uri.strip_prefix("file://") {
        Some(path) => percent_encoding::percent_decode_str(path).decode_utf8_lossy().into_owned(),
        None => uri.to_string(),
    }
}

fn extension(mime: &str) -> &'static str {
    match mime {
        "image/jpeg" | "image/jpg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        _ => "png",
    }
}

/// Where images of a turn are written: inside the workspace's hidden folder would pollute the user's
/// tree, so they go to the session's state dir, which the CLI can read.
pub fn attachments_dir(state_dir: &std::path::Path, turn_id: i64) -> PathBuf {
    state_dir.join("attachments").join(turn_id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{
        EmbeddedResource, ImageContent, ResourceLink, TextContent, TextResourceContents,
    };

    #[test]
    fn a_single_text_block_is_verbatim() {
        let text = "$(rm -rf /) ; \"q\" 'single' \\ \n\t ü\n";
        let rendered = render(&[ContentBlock::Text(TextContent::new(text))], false);
        assert_eq!(rendered.text, text);
    }

    #[test]
    fn links_stay_inline_and_resources_become_context() {
        let blocks = vec![
            ContentBlock::Text(TextContent::new("fix ")),
            ContentBlock::ResourceLink(ResourceLink::new("a b.rs", "file:///w/a%20b.rs")),
            ContentBlock::Text(TextContent::new(" using ")),
            ContentBlock::Resource(EmbeddedResource::new(EmbeddedResourceResource::TextResourceContents(
                TextResourceContents::new("fn x() {}", "file:///w/x.rs"),
            ))),
        ];
        let rendered = render(&blocks, false);
        assert_eq!(rendered.text, "fix /w/a b.rs using /w/x.rs\n\n<context ref=\"/w/x.rs\">\nfn x() {}\n</context>");
    }

    #[test]
    fn file_uris_become_decoded_paths() {
        assert_eq!(uri_to_path("file:///w/a%20b.rs"), "/w/a b.rs");
        assert_eq!(uri_to_path("file:///w/%E2%9C%93%2Fx"), "/w/\u{2713}/x");
        assert_eq!(uri_to_path("file:///w/100%zz%4"), "/w/100%zz%4", "what is not an escape stays");
        assert_eq!(uri_to_path("file:///w/%FF.rs"), "/w/\u{fffd}.rs");
        assert_eq!(uri_to_path("https://example.com/a%20b"), "https://example.com/a%20b");
    }

    #[test]
    fn images_are_attached_only_when_the_cli_takes_them() {
        let image = ContentBlock::Image(ImageContent::new("aGVsbG8=", "image/png"));
        assert_eq!(
            render(std::slice::from_ref(&image), true).images,
            vec![("image-1.png".to_string(), b"hello".to_vec())]
        );
        let rendered = render(&[image], false);
        assert!(rendered.images.is_empty());
        assert_eq!(rendered.dropped.len(), 1);
    }

    #[test]
    fn a_known_slash_command_is_split_from_its_arguments() {
        let mut text = "/review branch main".to_string();
        assert_eq!(split_command(&mut text, ["init", "review"]), Some("review".into()));
        assert_eq!(text, "branch main");
        let mut unknown = "/etc/hosts is odd".to_string();
        assert_eq!(split_command(&mut unknown, ["init", "review"]), None);
        assert_eq!(unknown, "/etc/hosts is odd");
        let mut bare = "/init".to_string();
        assert_eq!(split_command(&mut bare, ["init"]), Some("init".into()));
        assert_eq!(bare, "");
    }

    #[test]
    fn a_transcript_keeps_prompts_and_answers_newest_first_within_the_limit() {
        let turn = |id: i64, text: &str| crate::store::TurnRecord {
            id,
            session_id: "s".into(),
            prompt: serde_json::json!([{"type": "text", "text": text}]),
            status: crate::store::TurnStatus::Done,
            stop_reason: None,
            error: None,
            started_at: 0,
            ended_at: None,
        };
        let answer = |text: &str| {
            vec![
                serde_json::json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}),
                serde_json::json!({"sessionUpdate": "tool_call", "toolCallId": "t", "title": "x"}),
            ]
        };
        let turns = vec![(turn(1, "first question"), answer("first answer")), (turn(2, "second"), answer("two"))];
        let full = transcript(&turns, 10_000);
        assert!(full.contains("User:\nfirst question\n\nAssistant:\nfirst answer"), "{full}");
        assert!(full.find("first question") < full.find("second"));
        let cut = transcript(&turns, 30);
        assert!(!cut.contains("first question") && cut.contains("two"), "{cut}");
        assert_eq!(transcript(&[], 100), "");
        // The bridge's own notes are not the agent's answer.
        let mut noted = answer("the answer");
        noted.insert(0, serde_json::json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "\n\n_Amp runs WITHOUT a sandbox here._\n\n"}}));
        let text = transcript(&[(turn(1, "q"), noted)], 10_000);
        assert!(text.contains("User:\nq\n\nAssistant:\nthe answer\n</earlier-conversation>"), "{text}");
    }

    #[test]
    fn title_is_the_first_non_empty_line_shortened() {
        let long = format!("\n  {}\nsecond", "x".repeat(100));
        let shortened = title(&[ContentBlock::Text(TextContent::new(long))]).unwrap();
        assert_eq!(shortened.chars().count(), 80);
        assert!(shortened.ends_with('…'));
        assert_eq!(title(&[]), None);
    }
}
