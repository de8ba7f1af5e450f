//! Reasoning ("thinking") text in a model's output, `<think>...</think>`, split from the
//! answer as it streams (`--reasoning-parser`): the reasoning becomes `reasoning_content`,
//! the rest `content`. A tail that may be the start of a marker is held back one piece.
//!
//! - `qwen3`: the output reasons only when it opens with `<think>` (Qwen3 with
//!   `enable_thinking: false` gets an empty think block in its prompt and answers at once);
//! - `deepseek-r1`: the output starts inside the reasoning (the template opens `<think>` in
//!   the prompt), whether or not it repeats the `<think>`; without `</think>` all of it is
//!   reasoning.

use crate::text::markers::{held_tail, split_at_marker};

const START: &str = "<think>";
pub const END: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningFormat {
    Qwen3,
    #[value(name = "deepseek-r1")]
    DeepseekR1,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Before the first non-blank text: does it open with `<think>`?
    Start,
    Reasoning,
    /// Just after `</think>`: the blank lines before the answer are dropped.
    AnswerStart,
    Answer,
}

/// A piece of output split: (reasoning, content).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

pub struct ReasoningParser {
    format: ReasoningFormat,
    state: State,
    buf: String,
}

impl ReasoningParser {
    pub fn new(format: ReasoningFormat) -> Self {
        Self {
            format,
            state: State::Start,
            buf: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Split {
        self.buf.push_str(text);
        let mut out = Split::default();
        loop {
            let progressed = match self.state {
                State::Start => self.start(),
                State::Reasoning => self.reasoning(&mut out),
                State::AnswerStart => {
                    let trimmed = self.buf.trim_start().to_string();
                    self.buf = trimmed;
                    let answer = !self.buf.is_empty();
                    if answer {
                        self.state = State::Answer;
                    }
                    answer
                }
                State::Answer => {
                    out.content.push_str(&std::mem::take(&mut self.buf));
                    false
                }
            };
            if !progressed {
                return out;
            }
        }
    }

    /// The end of the output: what was held back goes where it was heading.
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Reasoning => Split {
                reasoning: rest,
                content: String::new(),
            },
            State::Start if self.format == ReasoningFormat::DeepseekR1 => Split {
                reasoning: rest,
                content: String::new(),
            },
            _ => Split {
                reasoning: String::new(),
                content: rest,
            },
        }
    }

    fn start(&mut self) -> bool {
        let trimmed = self.buf.trim_start();
        if trimmed.len() < START.len() && START.starts_with(trimmed) {
            return false; // blank, or a partial `<think>`
        }
        if let Some(rest) = trimmed.strip_prefix(START) {
            self.buf = rest.to_string();
            self.state = State::Reasoning;
        } else {
            self.state = match self.format {
                ReasoningFormat::Qwen3 => State::Answer,
                ReasoningFormat::DeepseekR1 => State::Reasoning,
            };
        }
        true
    }

    fn reasoning(&mut self, out: &mut Split) -> bool {
        let buf = std::mem::take(&mut self.buf);
        if let Some((thought, rest)) = split_at_marker(&buf, END) {
            out.reasoning.push_str(thought);
            self.buf = rest.to_string();
            self.state = State::AnswerStart;
            return true;
        }
        let keep = held_tail(&buf, END);
        out.reasoning.push_str(&buf[..buf.len() - keep]);
        self.buf = buf[buf.len() - keep..].to_string();
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(format: ReasoningFormat, text: &str) -> Split {
        let mut p = ReasoningParser::new(format);
        let mut a = p.push(text);
        let b = p.finish();
        a.reasoning.push_str(&b.reasoning);
        a.content.push_str(&b.content);
        a
    }

    fn streamed(format: ReasoningFormat, text: &str) -> Split {
        let mut p = ReasoningParser::new(format);
        let mut all = Split::default();
        for c in text.chars() {
            let s = p.push(&c.to_string());
            all.reasoning.push_str(&s.reasoning);
            all.content.push_str(&s.content);
        }
        let s = p.finish();
        all.reasoning.push_str(&s.reasoning);
        all.content.push_str(&s.content);
        all
    }

    fn check(format: ReasoningFormat, text: &str, reasoning: &str, content: &str) {
        let expected = Split {
            reasoning: reasoning.into(),
            content: content.into(),
        };
        assert_eq!(whole(format, text), expected, "{text:?}");
        assert_eq!(streamed(format, text), expected, "{text:?} streamed");
    }

    #[test]
    fn qwen3_thinks_only_when_it_opens_with_think() {
        let q = ReasoningFormat::Qwen3;
        check(
            q,
            "<think>\nThe user wants 2+2.\n</think>\n\n4",
            "\nThe user wants 2+2.\n",
            "4",
        );
        check(q, "4, no thinking", "", "4, no thinking");
        check(q, "\n<think>cut short", "cut short", "");
        check(q, "a < b </think>", "", "a < b </think>");
    }

    #[test]
    fn deepseek_r1_starts_inside_the_reasoning() {
        let d = ReasoningFormat::DeepseekR1;
        check(
            d,
            "Let me think.</think>The answer is 4.",
            "Let me think.",
            "The answer is 4.",
        );
        check(d, "<think>Hmm.</think>\n\nOK", "Hmm.", "OK");
        check(d, "never closed", "never closed", "");
    }
}
