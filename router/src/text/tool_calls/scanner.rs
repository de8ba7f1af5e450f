//! One tool call's JSON object read as it streams, `{"name": "f", "arguments": {...}}`: the
//! name as soon as its string closes, then the arguments' raw text as it arrives (OpenAI's
//! streamed `function.arguments` are pieces the client concatenates). It tracks only nesting,
//! strings with their escapes and the outer object's keys; it does not validate the JSON
//! (a grammar-constrained output is valid by construction, a free one is passed on as the
//! model wrote it, as OpenAI does).

/// What a piece of the object revealed.
#[derive(Debug, Clone, PartialEq)]
pub enum Scan {
    /// The call's name; comes once, before any `Args`.
    Name(String),
    /// More raw text of the arguments value.
    Args(String),
}

pub struct CallScanner {
    /// The keys whose value is the arguments (`arguments`, Llama's `parameters`).
    args_keys: &'static [&'static str],
    raw: String,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// In the outer object: the next string is a key (not a value).
    expect_key: bool,
    key_start: usize,
    key: Option<String>,
    /// Where the outer object's current value starts in `raw`; `scalar`: it is a number or
    /// literal, which ends at the next `,` or `}`.
    value_start: Option<usize>,
    scalar: bool,
    name: Option<String>,
    name_sent: bool,
    /// The arguments' range in `raw` (the end once known), and how much of it was sent.
    args: Option<(usize, Option<usize>)>,
    args_sent: usize,
    closed: bool,
}

impl CallScanner {
    /// A scanner whose first byte will be the object's `{`.
    pub fn new(args_keys: &'static [&'static str]) -> Self {
        Self {
            args_keys,
            raw: String::new(),
            depth: 0,
            in_string: false,
            escaped: false,
            expect_key: true,
            key_start: 0,
            key: None,
            value_start: None,
            scalar: false,
            name: None,
            name_sent: false,
            args: None,
            args_sent: 0,
            closed: false,
        }
    }

    /// The object's text so far (what is shown as content when it is not a call after all).
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// Whether the name was reported (the call is then the client's, whatever follows).
    pub fn started(&self) -> bool {
        self.name_sent
    }

    /// Reads `text`; returns what it revealed, and how many of its bytes belong to the
    /// object once the object closed (the rest is the caller's).
    pub fn push(&mut self, text: &str) -> (Vec<Scan>, Option<usize>) {
        let mut consumed = None;
        for (i, c) in text.char_indices() {
            let at = self.raw.len();
            self.raw.push(c);
            self.step(c, at);
            if self.closed {
                consumed = Some(i + c.len_utf8());
                break;
            }
        }
        (self.reveal(), consumed)
    }

    fn step(&mut self, c: char, at: usize) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
                if self.depth == 1 && self.value_start.is_none() {
                    self.key = serde_json::from_str(&self.raw[self.key_start..=at]).ok();
                } else if self.depth == 1 {
                    self.value_end(at + 1);
                }
            }
            return;
        }
        let starts_value = self.depth == 1 && !self.expect_key && self.value_start.is_none();
        match c {
            '"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.key_start = at;
                } else if starts_value {
                    self.value_start = Some(at);
                    self.note_args(at);
                }
            }
            '{' | '[' => {
                if starts_value {
                    self.value_start = Some(at);
                    self.note_args(at);
                }
                self.depth += 1;
            }
            '}' | ']' if self.depth == 1 => {
                if self.scalar {
                    self.value_end(at);
                }
                self.depth = 0;
                self.closed = true;
            }
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 1 {
                    self.value_end(at + 1);
                }
            }
            ':' if self.depth == 1 => self.expect_key = false,
            ',' if self.depth == 1 => {
                if self.scalar {
                    self.value_end(at);
                }
                self.expect_key = true;
            }
            c if starts_value && !c.is_whitespace() => {
                self.value_start = Some(at);
                self.scalar = true;
                self.note_args(at);
            }
            _ => {}
        }
    }

    fn note_args(&mut self, at: usize) {
        let is_args = self
            .key
            .as_deref()
            .is_some_and(|k| self.args_keys.contains(&k));
        if is_args && self.args.is_none() {
            self.args = Some((at, None));
        }
    }

    fn value_end(&mut self, end: usize) {
        let Some(start) = self.value_start.take() else {
            return;
        };
        self.scalar = false;
        match self.args {
            Some((s, None)) if s == start => self.args = Some((s, Some(end))),
            _ if self.key.as_deref() == Some("name") && self.name.is_none() => {
                self.name = serde_json::from_str(&self.raw[start..end]).ok();
            }
            _ => {}
        }
        self.key = None;
    }

    /// The name once known, then the arguments' text not yet sent; a call that closes
    /// without arguments gets `{}`.
    fn reveal(&mut self) -> Vec<Scan> {
        let mut out = Vec::new();
        let Some(name) = &self.name else {
            return out;
        };
        if !self.name_sent {
            self.name_sent = true;
            out.push(Scan::Name(name.clone()));
        }
        match self.args {
            Some((start, end)) => {
                let end = end.unwrap_or(self.raw.len());
                if start + self.args_sent < end {
                    out.push(Scan::Args(
                        self.raw[start + self.args_sent..end].to_string(),
                    ));
                    self.args_sent = end - start;
                }
            }
            None if self.closed => out.push(Scan::Args("{}".into())),
            None => {}
        }
        out
    }
}
