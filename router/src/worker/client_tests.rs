//! Tests of `client.rs`: a worker that goes away, comes back, or stops answering.

use std::sync::atomic::Ordering;
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
        fail_after: None,
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

async fn finish(client: &WorkerClient, ids: Vec<u32>) {
    let mut stream = client.submit(ids, Sampling::default()).unwrap();
    while let Some(Event::Token(_)) = stream.next().await {}
}

#[tokio::test]
async fn the_index_mirrors_cache_events_and_a_restarted_worker_starts_empty() {
    let worker = FakeWorker::start(script(false)).await;
    let address = worker.address.clone();
    let client = WorkerClient::connect(&address);
    client.wait_ready().await.unwrap();
    assert_eq!(client.prefix_match(&[1, 2, 3, 4, 5]).unwrap().cached, 0);
    finish(&client, vec![1, 2, 3, 4]).await;
    // The fake stored the prompt (page size 1) before its last token: already applied.
    let m = client.prefix_match(&[1, 2, 3, 4, 5]).unwrap();
    assert_eq!((m.cached, m.expected, client.cached_blocks()), (4, 4, 4));
    assert_eq!(client.prefix_match(&[1, 2, 9]).unwrap().cached, 2);
    // Its prediction was checked against its report (the fake always reports 3).
    let acc = client.accuracy();
    assert_eq!(acc.requests.load(Ordering::Relaxed), 1);
    assert_eq!(acc.mismatches.load(Ordering::Relaxed), 1);
    worker.stop().await;
    client.go_down("worker 0 exited");
    assert_eq!(client.cached_blocks(), 0);
    let _second = FakeWorker::start_at(&address, script(false)).await;
    until_state(&client, |s| matches!(s, WorkerState::Ready(_))).await;
    assert_eq!(client.prefix_match(&[1, 2, 3, 4, 5]).unwrap().cached, 0);
}

#[tokio::test]
async fn a_reconnected_worker_reports_its_cache_again() {
    let worker = FakeWorker::start(script(false)).await;
    // A short heartbeat: the fake is silent while idle, so the client reconnects.
    let client = WorkerClient::start(&worker.address, Some(Duration::from_millis(300)));
    client.wait_ready().await.unwrap();
    finish(&client, vec![7, 8, 9]).await;
    assert_eq!(client.cached_blocks(), 3);
    until_state(&client, |s| matches!(s, WorkerState::Down(_))).await;
    until_state(&client, |s| matches!(s, WorkerState::Ready(_))).await;
    // The snapshot after `ready` arrives in the same frame, applied right after it.
    tokio::time::timeout(Duration::from_secs(5), async {
        while client.cached_blocks() != 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the snapshot restores the index");
    assert_eq!(client.prefix_match(&[7, 8, 9, 1]).unwrap().cached, 3);
}
