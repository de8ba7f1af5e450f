//! The streaming tool-call parser: text in (as the detokenizer produces it), content and
//! call events out. Text that may still turn into a call (a partial `<tool_call>`, an opening
//! whose object has no name yet) is held back; if it turns out not to be a call, it is shown
//! as content after all. A complete output parsed in one piece gives the same events merged,
//! so a streamed answer assembles to the non-streamed one.
//!
//! States: `Text` (content; the format's opening marker leads to `Open`), `Open` (whitespace,
//! then Mistral's `[` or a call's `{`), `Call` (the object, read by `CallScanner`), `After`
//! (whitespace, then `</tool_call>`, a separator to the next call, or the list's `]`), and
//! `Plain` (Llama 3: an output that did not start with a call is content to its end).

use super::scanner::{CallScanner, Scan};
use super::ToolFormat;
use crate::text::markers::{held_tail, split_at_marker};

/// What a piece of output holds, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum CallEvent {
    Text(String),
    /// Call `index` begins (its name is known).
    Start {
        index: usize,
        name: String,
    },
    /// More of call `index`'s arguments (raw JSON text; the pieces concatenate).
    Args {
        index: usize,
        text: String,
    },
}

enum State {
    Text,
    Open,
    Call(CallScanner),
    After,
    Plain,
}

const PYTHON_TAG: &str = "<|python_tag|>";
const HERMES_MARKER: &str = "<tool_call>";
const MISTRAL_MARKER: &str = "[TOOL_CALLS]";

pub struct ToolCallParser {
    format: ToolFormat,
    state: State,
    /// Text received and not yet consumed.
    buf: String,
    /// Text consumed since the last opening that no started call owns yet: content, if
    /// what follows is not a call.
    pending: String,
    /// Nothing but whitespace seen: Llama 3's and Mistral's calls may start bare here.
    at_start: bool,
    in_list: bool,
    /// Calls started; calls past `max_calls` are read but not reported.
    calls: usize,
    max_calls: usize,
    reporting: bool,
    /// A call just ended: whitespace before the next content or call is not content.
    after_call: bool,
    /// The functions that may be called (empty: any); a call of another is content.
    names: Vec<String>,
    /// The call being read names a function not in `names`.
    unknown: bool,
}

impl ToolCallParser {
    /// `max_calls`: how many calls to report (1 when `parallel_tool_calls` is false).
    pub fn new(format: ToolFormat, max_calls: usize) -> Self {
        Self {
            format,
            state: State::Text,
            buf: String::new(),
            pending: String::new(),
            at_start: true,
            in_list: false,
            calls: 0,
            max_calls,
            reporting: false,
            after_call: false,
            names: Vec::new(),
            unknown: false,
        }
    }

    /// Only calls of these functions are calls; others are shown as content (as the model
    /// wrote them), so a client never gets a call it cannot make.
    pub fn with_names(mut self, names: Vec<String>) -> Self {
        self.names = names;
        self
    }

    /// Calls reported so far.
    pub fn calls(&self) -> usize {
        self.calls.min(self.max_calls)
    }

    pub fn push(&mut self, text: &str) -> Vec<CallEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.advance(&mut out) {}
        out
    }

    /// The end of the output: what was held back is content, unless a call owns it (a
    /// call cut short stays a call, with the arguments it got).
    pub fn finish(&mut self) -> Vec<CallEvent> {
        let mut out = Vec::new();
        let buf = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.state, State::Plain) {
            State::Text | State::Plain => self.text(&mut out, &buf),
            State::Open => {
                let pending = std::mem::take(&mut self.pending);
                self.text(&mut out, &(pending + &buf));
            }
            State::Call(scanner) if !scanner.started() || self.unknown => {
                let pending = std::mem::take(&mut self.pending);
                self.text(&mut out, &(pending + scanner.raw()));
            }
            State::Call(_) | State::After => {}
        }
        out
    }

    /// One step; false when more text is needed.
    fn advance(&mut self, out: &mut Vec<CallEvent>) -> bool {
        match &self.state {
            State::Text if self.at_start && self.format != ToolFormat::Hermes => {
                self.bare_start(out)
            }
            State::Text => self.text_until_marker(out),
            State::Plain => {
                let buf = std::mem::take(&mut self.buf);
                self.text(out, &buf);
                false
            }
            State::Open => self.open(out),
            State::Call(_) => self.call(out),
            State::After => self.after(),
        }
    }

    /// Llama 3 and Mistral may begin a call with the output itself (their markers are
    /// special tokens, which the detokenizer drops).
    fn bare_start(&mut self, out: &mut Vec<CallEvent>) -> bool {
        let trimmed = self.buf.trim_start();
        let tag = match self.format {
            ToolFormat::Llama3 => PYTHON_TAG,
            _ => MISTRAL_MARKER,
        };
        if trimmed.is_empty() || (trimmed.len() < tag.len() && tag.starts_with(trimmed)) {
            return false;
        }
        if trimmed.starts_with(MISTRAL_MARKER) {
            self.at_start = false; // the marker's own path
            return true;
        }
        if self.format == ToolFormat::Llama3 && trimmed.starts_with(PYTHON_TAG) {
            let at = self.buf.len() - trimmed.len() + PYTHON_TAG.len();
            self.pending.extend(self.buf.drain(..at));
            return true;
        }
        let opener = if self.format == ToolFormat::Llama3 {
            '{'
        } else {
            '['
        };
        if trimmed.starts_with(opener) {
            self.state = State::Open;
        } else if self.format == ToolFormat::Llama3 {
            let pending = std::mem::take(&mut self.pending);
            self.text(out, &pending);
            self.state = State::Plain;
        }
        self.at_start = false;
        true
    }

    fn text_until_marker(&mut self, out: &mut Vec<CallEvent>) -> bool {
        let marker = match self.format {
            ToolFormat::Hermes => HERMES_MARKER,
            ToolFormat::Mistral => MISTRAL_MARKER,
            ToolFormat::Llama3 => {
                self.state = State::Plain;
                return true;
            }
        };
        let buf = std::mem::take(&mut self.buf);
        if let Some((before, after)) = split_at_marker(&buf, marker) {
            self.text(out, before);
            self.pending = marker.to_string();
            self.buf = after.to_string();
            self.state = State::Open;
            return true;
        }
        let keep = held_tail(&buf, marker);
        self.text(out, &buf[..buf.len() - keep]);
        self.buf = buf[buf.len() - keep..].to_string();
        false
    }

    fn open(&mut self, out: &mut Vec<CallEvent>) -> bool {
        let ws = self.buf.len() - self.buf.trim_start().len();
        self.pending.extend(self.buf.drain(..ws));
        let Some(c) = self.buf.chars().next() else {
            return false;
        };
        let list = self.format == ToolFormat::Mistral && !self.in_list;
        if list && c == '[' {
            self.in_list = true;
            self.pending.extend(self.buf.drain(..1));
        } else if !list && c == '{' {
            let keys: &'static [&'static str] = &["arguments", "parameters"];
            self.state = State::Call(CallScanner::new(keys));
        } else {
            let pending = std::mem::take(&mut self.pending);
            self.text(out, &pending);
            self.in_list = false;
            self.state = State::Text;
        }
        true
    }

    fn call(&mut self, out: &mut Vec<CallEvent>) -> bool {
        let State::Call(scanner) = &mut self.state else {
            return false;
        };
        let (scans, consumed) = scanner.push(&self.buf);
        let named = scanner.started();
        let raw = consumed.is_some().then(|| scanner.raw().to_string());
        for scan in scans {
            match scan {
                Scan::Name(name) if !self.names.is_empty() && !self.names.contains(&name) => {
                    self.unknown = true;
                }
                Scan::Name(name) => {
                    self.pending.clear();
                    self.reporting = self.calls < self.max_calls;
                    if self.reporting {
                        out.push(CallEvent::Start {
                            index: self.calls,
                            name,
                        });
                    }
                    self.calls += 1;
                }
                Scan::Args(text) if self.reporting && !self.unknown => out.push(CallEvent::Args {
                    index: self.calls - 1,
                    text,
                }),
                Scan::Args(_) => {}
            }
        }
        let Some(consumed) = consumed else {
            self.buf.clear();
            return false;
        };
        self.buf.drain(..consumed);
        let started = named && !std::mem::take(&mut self.unknown);
        if started {
            self.after_call = true;
            self.state = State::After;
        } else {
            let pending = std::mem::take(&mut self.pending);
            self.text(out, &(pending + &raw.unwrap_or_default()));
            self.in_list = false;
            self.state = State::Text;
        }
        true
    }

    fn after(&mut self) -> bool {
        let trimmed = self.buf.trim_start().to_string();
        self.buf = trimmed;
        let Some(c) = self.buf.chars().next() else {
            return false;
        };
        let (next, used) = match self.format {
            ToolFormat::Hermes => {
                const CLOSE: &str = "</tool_call>";
                if self.buf.len() < CLOSE.len() && CLOSE.starts_with(self.buf.as_str()) {
                    return false;
                }
                let closed = self.buf.starts_with(CLOSE);
                (State::Text, if closed { CLOSE.len() } else { 0 })
            }
            ToolFormat::Mistral if c == ',' && self.in_list => (State::Open, 1),
            ToolFormat::Mistral if c == ']' => (State::Text, 1),
            ToolFormat::Llama3 if c == ';' => (State::Open, 1),
            ToolFormat::Llama3 => (State::Plain, 0),
            ToolFormat::Mistral => (State::Text, 0),
        };
        if !matches!(next, State::Open) {
            self.in_list = false;
        }
        self.buf.drain(..used);
        self.state = next;
        true
    }

    /// Content; the whitespace that follows a call is not.
    fn text(&mut self, out: &mut Vec<CallEvent>, text: &str) {
        let text = match self.after_call {
            true => text.trim_start(),
            false => text,
        };
        if text.is_empty() {
            return;
        }
        if !text.trim().is_empty() {
            self.at_start = false;
            self.after_call = false;
        }
        match out.last_mut() {
            Some(CallEvent::Text(last)) => last.push_str(text),
            _ => out.push(CallEvent::Text(text.to_string())),
        }
    }
}
