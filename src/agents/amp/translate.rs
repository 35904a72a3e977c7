//! Pure translation of amp's JSONL events into ACP updates (placeholder until the real mapping lands).

use crate::agents::{Output, TranslateContext, Translator};

/// Translator state for one turn.
pub struct AmpTranslator {
    _context: TranslateContext,
}

impl AmpTranslator {
    /// A translator for one turn.
    pub fn new(context: TranslateContext) -> Self {
        Self { _context: context }
    }
}

impl Translator for AmpTranslator {
    fn line(&mut self, line: &str) -> Vec<Output> {
        vec![Output::Unparsed {
            line: line.to_string(),
        }]
    }

    fn finish(&mut self) -> Vec<Output> {
        Vec::new()
    }
}
