//! The instant mock worker shared by examples/router_overhead.rs (in-process) and
//! examples/stub_worker.rs (its own process, for clients written in other languages): a ZMQ
//! DEALER bound on `address` that speaks the worker protocol and does no work. Every loop it
//! takes what arrived and sends one `step` with the next token of every running request, so a
//! request's N tokens come in N consecutive steps, batched like a real worker's.

use _router::worker::protocol::{
    decode_frame, encode_frame, Finish, Ready, RouterMsg, TokenOutput, WorkerMsg,
};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// The instant worker: `ready` in answer to `hello`, then one step per loop with every
/// running request's next token (`finish: length` at its `max_new_tokens`).
pub async fn mock_worker(address: String, reply: Vec<u32>) {
    let mut socket = DealerSocket::new();
    socket.bind(&address).await.unwrap();
    let ready = encode_frame(&[WorkerMsg::Ready(Ready {
        model: "mock".into(),
        vocab_size: 49152,
        max_context: 8192,
        kv_capacity: 1 << 20,
        eos_token_ids: vec![2],
        page_size: 1,
        tp_size: 1,
        device: "cpu".into(),
    })]);
    let (mut send, mut recv) = socket.split();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(message) = recv.recv().await {
            for frame in message.into_vec() {
                for msg in decode_frame::<RouterMsg>(&frame).unwrap() {
                    let _ = tx.send(msg);
                }
            }
        }
    });
    // (rid, produced, max_new_tokens)
    let mut running: Vec<(u64, u32, u32)> = Vec::new();
    loop {
        let mut hello = false;
        if running.is_empty() {
            match rx.recv().await {
                Some(msg) => hello |= take(msg, &mut running),
                None => return,
            }
        }
        while let Ok(msg) = rx.try_recv() {
            hello |= take(msg, &mut running);
        }
        if hello {
            send.send(ZmqMessage::from(ready.clone())).await.unwrap();
        }
        if running.is_empty() {
            continue;
        }
        let outputs: Vec<TokenOutput> = running
            .iter_mut()
            .map(|(rid, produced, max)| {
                let token = reply[*produced as usize % reply.len()];
                *produced += 1;
                TokenOutput {
                    rid: *rid,
                    token,
                    logprob: None,
                    top_logprobs: None,
                    finish: (*produced >= *max).then_some(Finish::Length),
                    cached_tokens: 0,
                }
            })
            .collect();
        running.retain(|(_, produced, max)| produced < max);
        let frame = encode_frame(&[WorkerMsg::Step { outputs }]);
        send.send(ZmqMessage::from(frame)).await.unwrap();
        tokio::task::yield_now().await;
    }
}

/// Applies one message; true for `hello`.
fn take(msg: RouterMsg, running: &mut Vec<(u64, u32, u32)>) -> bool {
    match msg {
        RouterMsg::Generate { rid, sampling, .. } => {
            running.push((rid, 0, sampling.max_new_tokens))
        }
        RouterMsg::Abort { rid } => running.retain(|r| r.0 != rid),
        RouterMsg::Shutdown => {}
        RouterMsg::Hello => return true,
    }
    false
}
