//! What a line typed in `--shell` means: a question, or one of the slash commands.

/// Help text for `/help`, one command a line.
pub const HELP: &str = "\
/reset                 forget the conversation
/system TEXT           set the system prompt (/system alone clears it)
/set temperature X     sampling temperature, 0 (greedy) to 2
/set max_tokens N      most tokens an answer may have
/settings              show the settings
/exit                  quit (so does Ctrl-D); Ctrl-C stops an answer";

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Ask(String),
    Reset,
    System(Option<String>),
    Temperature(f64),
    MaxTokens(u32),
    Settings,
    Help,
    Exit,
    Nothing,
}

/// A typed line -> its command, or a message saying what is wrong with it.
pub fn parse(line: &str) -> Result<Command, String> {
    let line = line.trim();
    let Some(rest) = line.strip_prefix('/') else {
        return Ok(match line {
            "" => Command::Nothing,
            text => Command::Ask(text.to_string()),
        });
    };
    let (name, arg) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let arg = arg.trim();
    match (name, arg) {
        ("reset", "") => Ok(Command::Reset),
        ("system", "") => Ok(Command::System(None)),
        ("system", text) => Ok(Command::System(Some(text.to_string()))),
        ("set", setting) => parse_setting(setting),
        ("settings", "") => Ok(Command::Settings),
        ("help", "") => Ok(Command::Help),
        ("exit" | "quit", "") => Ok(Command::Exit),
        _ => Err(format!("unknown command `{line}`; /help lists them")),
    }
}

fn parse_setting(setting: &str) -> Result<Command, String> {
    let (name, value) = setting
        .split_once(char::is_whitespace)
        .map(|(n, v)| (n, v.trim()))
        .unwrap_or((setting, ""));
    match name {
        "temperature" => match value.parse::<f64>() {
            Ok(t) if (0.0..=2.0).contains(&t) => Ok(Command::Temperature(t)),
            _ => Err(format!("temperature must be in [0, 2]; got `{value}`")),
        },
        "max_tokens" => match value.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(Command::MaxTokens(n)),
            _ => Err(format!("max_tokens must be an integer >= 1; got `{value}`")),
        },
        _ => Err(format!(
            "/set takes temperature or max_tokens; got `{setting}`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_commands() {
        assert_eq!(parse("  hi there "), Ok(Command::Ask("hi there".into())));
        assert_eq!(parse(""), Ok(Command::Nothing));
        assert_eq!(parse("/reset"), Ok(Command::Reset));
        assert_eq!(
            parse("/system You are terse."),
            Ok(Command::System(Some("You are terse.".into())))
        );
        assert_eq!(parse("/system"), Ok(Command::System(None)));
        assert_eq!(parse("/set temperature 0.7"), Ok(Command::Temperature(0.7)));
        assert_eq!(parse("/set max_tokens 64"), Ok(Command::MaxTokens(64)));
        assert_eq!(parse("/exit"), Ok(Command::Exit));
        assert_eq!(parse("/settings"), Ok(Command::Settings));
    }

    #[test]
    fn mistakes_say_what_is_wrong() {
        assert_eq!(
            parse("/set temperature 3"),
            Err("temperature must be in [0, 2]; got `3`".into())
        );
        assert_eq!(
            parse("/set max_tokens 0"),
            Err("max_tokens must be an integer >= 1; got `0`".into())
        );
        assert_eq!(
            parse("/set top_p 0.5"),
            Err("/set takes temperature or max_tokens; got `top_p 0.5`".into())
        );
        assert_eq!(
            parse("/reset now"),
            Err("unknown command `/reset now`; /help lists them".into())
        );
    }
}
