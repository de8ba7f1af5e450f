//! The ZeroMQ side of a worker client: a DEALER that connects to the worker's bound address,
//! says `hello` (the worker answers `ready`), then sends everything queued in one tick as
//! one frame and dispatches what comes back. A disconnect or a broken socket ends the
//! connection, and every in-flight request with an error; so do a spawned worker's death
//! (its launcher bumps the client's epoch) and a remote worker's silence past its
//! heartbeat. The worker is then connected to again, and serves once it has answered the
//! new `hello`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;
use zeromq::{
    DealerRecvHalf, DealerSendHalf, DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend,
    ZmqMessage,
};

use super::client::Inner;
use super::protocol::{decode_frame, encode_frame, RouterMsg, WorkerMsg};
use super::registry::Refusal;

/// One connect attempt; zmq.rs backs off up to 30 s between its own retries, which would
/// delay a worker that binds late, so attempts are short and repeated here.
const CONNECT_ATTEMPT: Duration = Duration::from_millis(500);

pub(super) async fn run(inner: Arc<Inner>, mut outgoing: mpsc::UnboundedReceiver<RouterMsg>) {
    loop {
        let socket = connect(&inner.address).await;
        while outgoing.try_recv().is_ok() {} // aborts meant for the last connection
        let Some(reason) = session(&inner, socket, &mut outgoing).await else {
            return; // every handle on this worker is gone
        };
        if !inner.lose_connection(&reason) {
            return;
        }
        tokio::time::sleep(CONNECT_ATTEMPT).await;
    }
}

/// One connection, until it breaks (-> why) or the client is dropped (-> None).
async fn session(
    inner: &Inner,
    mut socket: DealerSocket,
    outgoing: &mut mpsc::UnboundedReceiver<RouterMsg>,
) -> Option<String> {
    let monitor = socket.monitor();
    let mut epoch = inner.epoch.subscribe();
    epoch.mark_unchanged();
    let (mut send, recv) = socket.split();
    let hello = ZmqMessage::from(encode_frame(&[RouterMsg::Hello]));
    if let Err(e) = send.send(hello).await {
        return Some(format!("worker {}: cannot say hello: {e}", inner.address));
    }
    // Milliseconds since `start` when the worker last sent anything.
    let (start, heard) = (Instant::now(), AtomicU64::new(0));
    tokio::select! {
        reason = recv_loop(inner, recv, start, &heard) => Some(reason),
        reason = watch_disconnect(inner, monitor) => Some(reason),
        reason = heartbeat(inner, start, &heard) => Some(reason),
        _ = epoch.changed() => Some(format!("worker {} exited", inner.address)),
        () = send_loop(send, outgoing) => None,
    }
}

/// Ends the session when a ready worker has sent nothing for its heartbeat timeout.
async fn heartbeat(inner: &Inner, start: Instant, heard: &AtomicU64) -> String {
    let Some(timeout) = inner.heartbeat else {
        return std::future::pending().await;
    };
    loop {
        let last = start + Duration::from_millis(heard.load(Ordering::Relaxed));
        tokio::time::sleep_until((last + timeout).into()).await;
        let last = start + Duration::from_millis(heard.load(Ordering::Relaxed));
        let silent = last.elapsed();
        // Before its `ready` a worker may still be loading: silence is expected then.
        if silent >= timeout && inner.is_ready() {
            return format!(
                "worker {} sent nothing for {:.1} s (heartbeat timeout {} s)",
                inner.address,
                silent.as_secs_f64(),
                timeout.as_secs()
            );
        }
        if silent >= timeout {
            heard.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    }
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

async fn send_loop(mut socket: DealerSendHalf, outgoing: &mut mpsc::UnboundedReceiver<RouterMsg>) {
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

async fn recv_loop(
    inner: &Inner,
    mut socket: DealerRecvHalf,
    start: Instant,
    heard: &AtomicU64,
) -> String {
    loop {
        let message = match socket.recv().await {
            Ok(message) => message,
            Err(e) => return format!("worker {} connection broke: {e}", inner.address),
        };
        heard.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        for frame in message.into_vec() {
            match decode_frame::<WorkerMsg>(&frame) {
                Ok(msgs) => msgs.into_iter().for_each(|m| handle(inner, m)),
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
        WorkerMsg::Step { outputs } => inner.requests.dispatch(outputs, &inner.accuracy),
        WorkerMsg::CacheEvents { stored, removed } => inner.apply_cache_events(&stored, &removed),
        WorkerMsg::Error {
            rid: Some(rid),
            code,
            message,
        } => inner.requests.refuse(rid, Refusal { code, message }),
        WorkerMsg::Error {
            rid: None,
            code,
            message,
        } => {
            tracing::warn!(worker = %inner.address, ?code, "worker reports: {message}")
        }
        WorkerMsg::Load(load) => inner.set_load(load),
    }
}

async fn watch_disconnect(
    inner: &Inner,
    mut monitor: futures::channel::mpsc::Receiver<SocketEvent>,
) -> String {
    while let Some(event) = monitor.next().await {
        if let SocketEvent::Disconnected(_) = event {
            return format!("worker {} disconnected", inner.address);
        }
    }
    std::future::pending().await // no monitor: the receive side notices a broken socket
}
