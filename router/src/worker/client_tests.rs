//! Tests of `client.rs`: a worker that goes away, comes back, or stops answering.

use std::time::Duration;

use super::super::fake::{FakeScript, FakeWorker};
use super::super::registry::Event;
use super::*;

fn script(stall: bool) -> FakeScript {
    FakeScript {
        reply: vec![5, 6, 7],
        eos: 2,
        max_context: 100,
        stall,
    }
}

async fn until_state(client: &WorkerClient, want: fn(&WorkerState) -> bool) {
    let mut rx = client.inner.state.subscribe();
    let wait = rx.wait_for(want);
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("state change within 10 s")
        .unwrap();
}

#[tokio::test]
async fn a_remote_worker_that_comes_back_serves_again() {
    let first = FakeWorker::start(script(true)).await;
    let client = WorkerClient::connect_remote(&first.address);
    client.wait_ready().await.unwrap();
    let mut stream = client.submit(vec![1, 2], Sampling::default()).unwrap();
    let address = first.address.clone();
    first.stop().await; // it goes away with a request in flight
    match stream.next().await {
        Some(Event::Failed(ApiError::Unavailable(m))) => assert!(m.contains(&address), "{m}"),
        other => panic!("unexpected {other:?}"),
    }
    until_state(&client, |s| matches!(s, WorkerState::Down(_))).await;
    assert!(client.submit(vec![1], Sampling::default()).is_err());
    let second = FakeWorker::start_at(&address, script(false)).await;
    until_state(&client, |s| matches!(s, WorkerState::Ready(_))).await;
    let sampling = Sampling {
        max_new_tokens: 2,
        ..Sampling::default()
    };
    let mut stream = client.submit(vec![1, 2], sampling).unwrap();
    let mut tokens = Vec::new();
    while let Some(Event::Token(out)) = stream.next().await {
        tokens.push(out.token);
    }
    assert_eq!(tokens, [5, 6]);
    assert_eq!(client.readies(), 2);
    assert_eq!(second.log.lock().unwrap().generated.len(), 1);
}

#[tokio::test]
async fn a_spawned_worker_that_goes_away_is_down_until_its_new_process_answers() {
    let worker = FakeWorker::start(script(true)).await;
    let address = worker.address.clone();
    let client = WorkerClient::connect(&address);
    client.wait_ready().await.unwrap();
    let mut stream = client.submit(vec![1, 2], Sampling::default()).unwrap();
    worker.stop().await;
    // What its launcher does on the process's exit: the request fails at once.
    client.go_down("worker 0 exited (signal: 9 (SIGKILL)); restart 1 in 1 s");
    match stream.next().await {
        Some(Event::Failed(ApiError::Unavailable(m))) => assert!(m.contains("SIGKILL"), "{m}"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(client.state(), WorkerState::Down(_)));
    assert!(client.submit(vec![1], Sampling::default()).is_err());
    client.count_restart();
    let _second = FakeWorker::start_at(&address, script(false)).await;
    until_state(&client, |s| matches!(s, WorkerState::Ready(_))).await;
    assert_eq!((client.readies(), client.restarts()), (2, 1));
    assert!(client.submit(vec![1], Sampling::default()).is_ok());
}

#[tokio::test]
async fn a_remote_worker_that_stops_answering_is_marked_down() {
    let worker = FakeWorker::start(script(true)).await;
    // The fake sends nothing while idle: it stands for a worker that stopped (SIGSTOP).
    let client = WorkerClient::start(&worker.address, Some(Duration::from_millis(300)));
    client.wait_ready().await.unwrap();
    let mut stream = client.submit(vec![1, 2], Sampling::default()).unwrap();
    let failed = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
    match failed.expect("failed within 5 s") {
        Some(Event::Failed(ApiError::Unavailable(m))) => {
            assert!(m.contains("heartbeat timeout"), "{m}")
        }
        other => panic!("unexpected {other:?}"),
    }
    // It answers the new connection's hello: ready again.
    until_state(&client, |s| matches!(s, WorkerState::Ready(_))).await;
    assert!(client.readies() >= 2);
}

#[tokio::test]
async fn failing_a_worker_ends_its_requests_and_refuses_new_ones() {
    let client = WorkerClient::connect("ipc:///tmp/minisgl-test-nobody-listens.sock");
    client.inner.set_ready(Ready {
        model: "m".into(),
        vocab_size: 10,
        max_context: 100,
        kv_capacity: 100,
        eos_token_ids: vec![0],
        page_size: 1,
        tp_size: 1,
        device: "cpu".into(),
    });
    let mut stream = client.submit(vec![1, 2], Sampling::default()).unwrap();
    client.fail("worker 0 exited with status 1");
    match stream.next().await {
        Some(Event::Failed(ApiError::Unavailable(m))) => assert!(m.contains("exited")),
        other => panic!("unexpected {other:?}"),
    }
    assert!(client.submit(vec![1], Sampling::default()).is_err());
    assert_eq!(
        client.wait_ready().await,
        Err("worker 0 exited with status 1".into())
    );
}
