//! The ZeroMQ side of a worker client: a DEALER that connects to the worker's bound address,
//! a send task that batches everything queued in one tick into one frame, and a receive
//! task that decodes frames and dispatches them. A disconnect or a broken socket fails the
//! worker (every in-flight request ends with an error).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use zeromq::{
    DealerRecvHalf, DealerSendHalf, DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend,
    ZmqMessage,
};

use super::client::Inner;
use super::protocol::{decode_frame, encode_frame, RouterMsg, WorkerMsg};

/// One connect attempt; zmq.rs backs off up to 30 s between its own retries, which would
/// delay a worker that binds late, so attempts are short and repeated here.
const CONNECT_ATTEMPT: Duration = Duration::from_millis(500);

pub(super) async fn run(inner: Arc<Inner>, outgoing: mpsc::UnboundedReceiver<RouterMsg>) {
    let mut socket = connect(&inner.address).await;
    let monitor = socket.monitor();
    let (send, recv) = socket.split();
    tokio::spawn(send_loop(send, outgoing));
    tokio::spawn(watch_disconnect(inner.clone(), monitor));
    recv_loop(inner, recv).await;
}

async fn connect(address: &str) -> DealerSocket {
    loop {
        let mut socket = DealerSocket::new();
        match tokio::time::timeout(CONNECT_ATTEMPT, socket.connect(address)).await {
            Ok(Ok(())) => return socket,
            Ok(Err(e)) => {
                tracing::debug!(address, "connect failed: {e}");
                tokio::time::sleep(CONNECT_ATTEMPT).await;
            }
            Err(_) => tracing::debug!(address, "worker not listening yet"),
        }
    }
}

async fn send_loop(mut socket: DealerSendHalf, mut outgoing: mpsc::UnboundedReceiver<RouterMsg>) {
    while let Some(first) = outgoing.recv().await {
        // Let the handlers that are runnable in this tick queue their messages too.
        tokio::task::yield_now().await;
        let mut batch = vec![first];
        while let Ok(msg) = outgoing.try_recv() {
            batch.push(msg);
        }
        if let Err(e) = socket.send(ZmqMessage::from(encode_frame(&batch))).await {
            tracing::warn!("cannot send {} message(s) to the worker: {e}", batch.len());
        }
    }
}

async fn recv_loop(inner: Arc<Inner>, mut socket: DealerRecvHalf) {
    loop {
        let message = match socket.recv().await {
            Ok(message) => message,
            Err(e) => {
                inner.fail(&format!("worker {} connection broke: {e}", inner.address));
                return;
            }
        };
        for frame in message.into_vec() {
            match decode_frame::<WorkerMsg>(&frame) {
                Ok(msgs) => msgs.into_iter().for_each(|m| handle(&inner, m)),
                Err(e) => tracing::warn!(worker = %inner.address, "dropped a frame: {e}"),
            }
        }
    }
}

fn handle(inner: &Inner, msg: WorkerMsg) {
    match msg {
        WorkerMsg::Ready(ready) => {
            tracing::info!(worker = %inner.address, model = %ready.model, device = %ready.device,
                max_context = ready.max_context, kv_capacity = ready.kv_capacity, "worker ready");
            inner.set_ready(ready);
        }
        WorkerMsg::Step { outputs } => inner.dispatch(outputs),
        WorkerMsg::Error {
            rid: Some(rid),
            message,
        } => inner.fail_request(rid, message),
        WorkerMsg::Error { rid: None, message } => {
            tracing::warn!(worker = %inner.address, "worker reports: {message}")
        }
        WorkerMsg::Load(load) => inner.set_load(load),
    }
}

async fn watch_disconnect(
    inner: Arc<Inner>,
    mut monitor: futures::channel::mpsc::Receiver<SocketEvent>,
) {
    while let Some(event) = monitor.next().await {
        if let SocketEvent::Disconnected(_) = event {
            inner.fail(&format!("worker {} disconnected", inner.address));
            return;
        }
    }
}
