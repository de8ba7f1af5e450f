//! Finding a marker (`<tool_call>`, `</think>`) in text that arrives in pieces: what may be
//! shown now, and the tail to hold back because the next piece may complete the marker.

/// The length of the longest tail of `text` that is a proper prefix of `marker` (0 if
/// none): those bytes are held back until the next piece says whether the marker follows.
pub fn held_tail(text: &str, marker: &str) -> usize {
    let longest = marker.len().saturating_sub(1).min(text.len());
    (1..=longest)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// `text` split at `marker`: (before, after), or None when the marker is not (yet) in it.
pub fn split_at_marker<'a>(text: &'a str, marker: &str) -> Option<(&'a str, &'a str)> {
    let at = text.find(marker)?;
    Some((&text[..at], &text[at + marker.len()..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_only_a_possible_marker_start() {
        assert_eq!(held_tail("hello <tool", "<tool_call>"), 5);
        assert_eq!(held_tail("hello <", "<tool_call>"), 1);
        assert_eq!(held_tail("hello", "<tool_call>"), 0);
        assert_eq!(held_tail("<tool_call>", "<tool_call>"), 0);
        assert_eq!(held_tail("é<", "</think>"), 1);
        assert_eq!(split_at_marker("a</think>b", "</think>"), Some(("a", "b")));
        assert_eq!(split_at_marker("a</thi", "</think>"), None);
    }
}
