//! A stand-in worker for the router's tests: a real zmq.rs DEALER bound on an ipc address,
//! speaking the protocol (protocol.rs). It answers `hello` with `ready` (forgetting what it
//! ran) and a `cache_events` listing its cache, then every tick emits one token for each
//! running request: the scripted reply, then EOS (`finish: stop`), or `finish: length` at
//! the limit. Its cache (page size 1) keeps every finished prompt, reported before the last
//! token. Like the real worker's grammar engine, it refuses a constraint with a JSON
//! Schema `not` (`invalid_constraint`).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::protocol::{
    decode_frame, encode_frame, ErrorCode, Finish, Ready, RouterMsg, Sampling, TokenOutput,
    WorkerMsg,
};
use crate::routing::blocks::block_hashes;

#[derive(Clone)]
pub struct FakeScript {
    pub reply: Vec<u32>,
    pub eos: u32,
    pub max_context: u32,
    /// Produce no tokens (requests stay in flight until aborted) until `resume`.
    pub stall: bool,
    /// After this many tokens of a request, an `internal` error for it instead of the next
    /// one (as a worker step that failed sends).
    pub fail_after: Option<u32>,
}

#[derive(Default)]
pub struct FakeLog {
    pub generated: Vec<(u64, Vec<u32>, Sampling)>,
    pub aborted: Vec<u64>,
}

pub struct FakeWorker {
    pub address: String,
    pub log: Arc<Mutex<FakeLog>>,
    stalled: Arc<AtomicBool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeWorker {
    pub async fn start(script: FakeScript) -> Self {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = format!("/tmp/minisgl-fake-{}-{n}.sock", std::process::id());
        Self::start_at(&format!("ipc://{path}"), script).await
    }

    /// A worker on `address` (ipc://), e.g. one that restarts where another stopped.
    pub async fn start_at(address: &str, script: FakeScript) -> Self {
        let _ = std::fs::remove_file(address.trim_start_matches("ipc://"));
        let address = address.to_string();
        let mut socket = DealerSocket::new();
        socket.bind(&address).await.expect("bind fake worker");
        let log = Arc::new(Mutex::new(FakeLog::default()));
        let stalled = Arc::new(AtomicBool::new(script.stall));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(serve(socket, script, log.clone(), stalled.clone(), stopped));
        Self {
            address,
            log,
            stalled,
            stop: Some(stop),
            task,
        }
    }

    /// Closes its socket (zmq.rs removes the socket file then; after a plain drop it does so
    /// later, maybe after another worker has bound the same path).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// A stalled worker starts producing tokens for the requests it holds.
    pub fn resume(&self) {
        self.stalled.store(false, Ordering::Relaxed);
    }

    /// Simulates a crash: the socket closes without a word.
    pub fn kill(&self) {
        self.task.abort();
    }
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(self.address.trim_start_matches("ipc://"));
    }
}

struct Running {
    input_ids: Vec<u32>,
    sampling: Sampling,
    produced: u32,
}

async fn serve(
    mut socket: DealerSocket,
    script: FakeScript,
    log: Arc<Mutex<FakeLog>>,
    stalled: Arc<AtomicBool>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let ready = WorkerMsg::Ready(Ready {
        model: "fake".into(),
        vocab_size: 400,
        max_context: script.max_context,
        kv_capacity: 100_000,
        eos_token_ids: vec![script.eos],
        page_size: 1,
        tp_size: 1,
        device: "cpu".into(),
    });
    let mut running: BTreeMap<u64, Running> = BTreeMap::new();
    let mut cache: HashSet<u64> = HashSet::new();
    loop {
        if stop.try_recv().is_ok() {
            socket.close().await;
            return;
        }
        let incoming = tokio::time::timeout(Duration::from_millis(2), socket.recv()).await;
        let mut replies = Vec::new();
        if let Ok(Ok(message)) = incoming {
            for msg in decode_frame::<RouterMsg>(&message.into_vec()[0]).unwrap() {
                match msg {
                    RouterMsg::Generate {
                        rid,
                        input_ids,
                        sampling,
                    } => {
                        log.lock().unwrap().generated.push((
                            rid,
                            input_ids.clone(),
                            sampling.clone(),
                        ));
                        if let Some((code, message)) = refusal(&input_ids, &sampling, &script) {
                            replies.push(WorkerMsg::Error {
                                rid: Some(rid),
                                code,
                                message,
                            });
                        } else {
                            running.insert(
                                rid,
                                Running {
                                    input_ids,
                                    sampling,
                                    produced: 0,
                                },
                            );
                        }
                    }
                    RouterMsg::Abort { rid } => {
                        running.remove(&rid);
                        log.lock().unwrap().aborted.push(rid);
                    }
                    RouterMsg::Shutdown => return,
                    RouterMsg::Hello => {
                        running.clear();
                        replies.push(ready.clone());
                        replies.push(WorkerMsg::CacheEvents {
                            stored: cache.iter().copied().collect(),
                            removed: vec![],
                        });
                    }
                }
            }
        }
        if !stalled.load(Ordering::Relaxed) && !running.is_empty() {
            fail(&script, &mut running, &mut replies);
            let outputs = step(&script, &mut running);
            let mut stored = Vec::new();
            for out in outputs.iter().filter(|o| o.finish.is_some()) {
                let prompt = &running[&out.rid].input_ids;
                stored.extend(
                    block_hashes(prompt, 1)
                        .into_iter()
                        .filter(|&h| cache.insert(h)),
                );
            }
            let finished: Vec<u64> = outputs
                .iter()
                .filter(|o| o.finish.is_some())
                .map(|o| o.rid)
                .collect();
            running.retain(|rid, _| !finished.contains(rid));
            if !stored.is_empty() {
                replies.push(WorkerMsg::CacheEvents {
                    stored,
                    removed: vec![],
                });
            }
            replies.push(WorkerMsg::Step { outputs });
        }
        if !replies.is_empty() {
            // Fails only when the router is gone; a new one starts with `hello`.
            let _ = socket.send(ZmqMessage::from(encode_frame(&replies))).await;
        }
    }
}

/// The scripted failures (`fail_after`): an error for each, which ends it.
fn fail(script: &FakeScript, running: &mut BTreeMap<u64, Running>, replies: &mut Vec<WorkerMsg>) {
    let Some(after) = script.fail_after else {
        return;
    };
    running.retain(|&rid, req| {
        if req.produced < after {
            return true;
        }
        replies.push(WorkerMsg::Error {
            rid: Some(rid),
            code: ErrorCode::Internal,
            message: "worker step failed: scripted".into(),
        });
        false
    });
}

fn step(script: &FakeScript, running: &mut BTreeMap<u64, Running>) -> Vec<TokenOutput> {
    let mut outputs = Vec::new();
    for (&rid, req) in running.iter_mut() {
        let i = req.produced as usize;
        req.produced += 1;
        let (token, finish) = match script.reply.get(i) {
            Some(&t) if req.produced >= req.sampling.max_new_tokens => (t, Some(Finish::Length)),
            Some(&t) => (t, None),
            None => (script.eos, Some(Finish::Stop)),
        };
        let logprobs = req.sampling.logprobs;
        let alternative = |k: u32| match k {
            2 => f64::NEG_INFINITY, // as a grammar's mask leaves a token
            _ => -0.5 - k as f64,
        };
        let top = (0..req.sampling.top_logprobs)
            .map(|k| (token + k, alternative(k)))
            .collect();
        outputs.push(TokenOutput {
            rid,
            token,
            logprob: logprobs.then_some(-0.5),
            top_logprobs: logprobs.then_some(top),
            finish,
            cached_tokens: 3,
        });
    }
    outputs
}

/// Why the fake worker refuses a request, if it does.
fn refusal(
    input_ids: &[u32],
    sampling: &Sampling,
    script: &FakeScript,
) -> Option<(ErrorCode, String)> {
    if input_ids.len() as u32 > script.max_context {
        let message = format!(
            "prompt has {} tokens; the context is {}",
            input_ids.len(),
            script.max_context
        );
        return Some((ErrorCode::ContextTooLong, message));
    }
    let constraint = sampling.constraint.as_ref()?;
    constraint.source.contains(r#""not""#).then(|| {
        let message = r#"json_schema constraint: Unimplemented keys: ["not"]"#;
        (ErrorCode::InvalidConstraint, message.to_string())
    })
}
