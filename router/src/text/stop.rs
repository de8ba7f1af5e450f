//! Stop strings, matched on detokenized text across token boundaries.
//!
//! Text arrives in pieces (one per token). A stop string may straddle pieces, so the matcher
//! keeps back the longest suffix of the unreleased text that is still a prefix of some stop
//! string; everything before it is safe to show. When a stop string appears, the text before
//! its first occurrence is released and nothing after it ever is.

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not released yet (a possible start of a stop string).
    pending: String,
}

#[derive(Debug, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text that can be shown now.
    pub text: String,
    /// A stop string matched: the request is over and `text` is its last piece.
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self {
            stops,
            pending: String::new(),
        }
    }

    pub fn push(&mut self, piece: &str) -> StopOutcome {
        self.pending.push_str(piece);
        if let Some(at) = self.first_match() {
            let text = self.pending[..at].to_string();
            self.pending.clear();
            return StopOutcome {
                text,
                stopped: true,
            };
        }
        let keep = self.partial_match_len();
        let text = self.pending[..self.pending.len() - keep].to_string();
        self.pending.drain(..self.pending.len() - keep);
        StopOutcome {
            text,
            stopped: false,
        }
    }

    /// The request ended without a stop string: whatever was held back is shown after all.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    fn first_match(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn partial_match_len(&self) -> usize {
        let text = self.pending.as_bytes();
        let longest = self.stops.iter().map(|s| s.len() - 1).max().unwrap_or(0);
        for len in (1..=longest.min(text.len())).rev() {
            let start = text.len() - len;
            let suffix = &text[start..];
            if self.pending.is_char_boundary(start)
                && self.stops.iter().any(|s| s.as_bytes().starts_with(suffix))
            {
                return len;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let o = m.push(p);
            out.push_str(&o.text);
            if o.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn no_stops_passes_everything_through() {
        let mut m = StopMatcher::new(vec![]);
        assert_eq!(
            m.push("abc"),
            StopOutcome {
                text: "abc".into(),
                stopped: false
            }
        );
    }

    #[test]
    fn matches_across_pieces_and_drops_the_rest() {
        assert_eq!(
            run(&["STOP"], &["Hello S", "TO", "P world"]),
            ("Hello ".into(), true)
        );
    }

    #[test]
    fn holds_back_only_a_possible_prefix() {
        let mut m = StopMatcher::new(vec!["\n\n".into()]);
        assert_eq!(m.push("a\n").text, "a");
        assert_eq!(m.push("b").text, "\nb");
    }

    #[test]
    fn false_start_is_released_at_the_end() {
        assert_eq!(run(&["STOP"], &["ST", "O"]), ("STO".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(
            run(&["world", "lo"], &["Hello world"]),
            ("Hel".into(), true)
        );
    }

    #[test]
    fn multibyte_text_is_split_on_char_boundaries() {
        assert_eq!(run(&["日本"], &["café 日", "本語"]), ("café ".into(), true));
        assert_eq!(run(&["é!"], &["caf", "é", "?"]), ("café?".into(), false));
    }

    #[test]
    fn stop_at_the_very_start_emits_nothing() {
        assert_eq!(run(&["Hi"], &["Hi there"]), ("".into(), true));
    }
}
