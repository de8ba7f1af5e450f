//! `minisgl-router --shell`: a chat in the terminal over the server's own HTTP API (the one
//! this process serves, or another's with `--url`). Lines are read with rustyline (editing,
//! history); each question is sent with the whole conversation and its answer streamed.
//!
//! Ctrl-C while an answer streams stops that answer: the terminal is in its normal mode then,
//! so Ctrl-C is a SIGINT, and dropping the request closes its connection, which makes the
//! router abort it in the worker. At the prompt rustyline reads Ctrl-C as a key (the line is
//! dropped); Ctrl-D or `/exit` ends the shell. An editor takes SIGINT over for as long as it
//! lives, so each line gets a new one (handed the history), and none exists while an answer
//! streams.

mod client;
mod commands;

use std::io::Write;

use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use serde_json::{json, Value};

use client::ChatClient;
use commands::{parse, Command, HELP};

const PROMPT: &str = ">>> ";

/// What every request carries besides the conversation.
struct Settings {
    system: Option<String>,
    temperature: f64,
    max_tokens: u32,
}

/// Runs the shell against the server at `base` until `/exit` or Ctrl-D.
pub async fn run(base: &str, api_key: Option<String>) -> Result<(), String> {
    let client = ChatClient::new(base, api_key)?;
    let model = client.model().await?;
    println!("minisgl shell: {model} at {base}. /help lists the commands; Ctrl-C stops an answer, Ctrl-D quits.");
    let mut settings = Settings {
        system: None,
        temperature: 0.7,
        max_tokens: 1024,
    };
    let mut history: Vec<Value> = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    loop {
        let line = match read_line(&mut lines).await? {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => return Ok(()),
            Err(e) => return Err(format!("cannot read the terminal: {e}")),
        };
        match parse(&line) {
            Ok(Command::Exit) => return Ok(()),
            Ok(Command::Ask(text)) => {
                history.push(json!({"role": "user", "content": text}));
                match ask(&client, &model, &settings, &history).await {
                    Some(content) => history.push(json!({"role": "assistant", "content": content})),
                    None => {
                        history.pop(); // no answer: the question leaves the context
                    }
                }
            }
            Ok(command) => apply(command, &mut settings, &mut history),
            Err(message) => println!("{message}"),
        }
    }
}

/// One line from a new editor that has the lines typed before as its history (rustyline
/// blocks: it reads on a blocking thread).
async fn read_line(lines: &mut Vec<String>) -> Result<rustyline::Result<String>, String> {
    let before = lines.clone();
    let line = tokio::task::spawn_blocking(move || {
        let mut editor = DefaultEditor::new()?;
        for line in before {
            editor.add_history_entry(line)?;
        }
        editor.readline(PROMPT)
    })
    .await
    .map_err(|e| format!("the line reader failed: {e}"))?;
    if let Ok(line) = &line {
        if !line.trim().is_empty() {
            lines.push(line.clone());
        }
    }
    Ok(line)
}

fn apply(command: Command, settings: &mut Settings, history: &mut Vec<Value>) {
    match command {
        Command::Reset => {
            history.clear();
            println!("[conversation cleared]");
        }
        Command::System(text) => {
            println!(
                "[system prompt {}]",
                if text.is_some() { "set" } else { "cleared" }
            );
            settings.system = text;
        }
        Command::Temperature(t) => {
            settings.temperature = t;
            println!("[temperature {t}]");
        }
        Command::MaxTokens(n) => {
            settings.max_tokens = n;
            println!("[max_tokens {n}]");
        }
        Command::Settings => println!(
            "temperature {}, max_tokens {}, system prompt: {}",
            settings.temperature,
            settings.max_tokens,
            settings.system.as_deref().unwrap_or("(none)")
        ),
        Command::Help => println!("{HELP}"),
        Command::Ask(_) | Command::Exit | Command::Nothing => {}
    }
}

/// Streams one answer to stdout -> its text, or None when it failed or was stopped.
async fn ask(
    client: &ChatClient,
    model: &str,
    settings: &Settings,
    history: &[Value],
) -> Option<String> {
    let mut messages = Vec::with_capacity(history.len() + 1);
    if let Some(system) = &settings.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.extend_from_slice(history);
    let body = json!({
        "model": model,
        "messages": messages,
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
    });
    let mut stdout = std::io::stdout();
    let answer = client.chat(body, |text| {
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    });
    let result = tokio::select! {
        answer = answer => Some(answer),
        _ = tokio::signal::ctrl_c() => None,
    };
    match result {
        Some(Ok(answer)) => {
            println!("\n[{}]", answer.stats());
            Some(answer.content)
        }
        Some(Err(message)) => {
            println!("\n[error: {message}]");
            None
        }
        None => {
            println!("\n[stopped]");
            None
        }
    }
}
