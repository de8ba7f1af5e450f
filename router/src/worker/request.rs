//! One in-flight request as the HTTP side sees it: a stream of events, plus the guarantee
//! that a request nobody reads any more is aborted on the worker (its KV freed at once).
//! It also holds the request's admission slot, freed the moment the request is over.

use tokio::sync::mpsc;

use super::client::WorkerClient;
use super::registry::Event;
use crate::api::admission::Slot;

pub struct RequestStream {
    rid: u64,
    events: mpsc::UnboundedReceiver<Event>,
    client: WorkerClient,
    /// The worker has finished the request (last output or error): nothing to abort.
    finished: bool,
    /// Its place in the router's in-flight count; dropped once, when `finished` is set or
    /// the stream is dropped (client gone, worker dead: both end here).
    slot: Option<Slot>,
}

impl RequestStream {
    pub(super) fn new(
        rid: u64,
        events: mpsc::UnboundedReceiver<Event>,
        client: WorkerClient,
    ) -> Self {
        Self {
            rid,
            events,
            client,
            finished: false,
            slot: None,
        }
    }

    /// Counts this request in flight until it is over.
    pub fn hold(&mut self, slot: Slot) {
        if !self.finished {
            self.slot = Some(slot);
        }
    }

    pub fn rid(&self) -> u64 {
        self.rid
    }

    /// The next output or error; None after the request has finished. After an error the
    /// slot stays held until the stream is dropped, so that a retry can take it over.
    pub async fn next(&mut self) -> Option<Event> {
        if self.finished {
            return None;
        }
        let event = self.events.recv().await;
        match &event {
            Some(Event::Token(out)) if out.finish.is_none() => {}
            Some(Event::Failed(_) | Event::Refused(_)) => self.finished = true,
            _ => self.finish(),
        }
        event
    }

    /// Its admission slot, for the request that takes over from this one.
    pub fn take_slot(&mut self) -> Option<Slot> {
        self.slot.take()
    }

    pub fn worker(&self) -> &WorkerClient {
        &self.client
    }

    /// Stops the request early (a stop string matched); the worker frees it now.
    pub fn abort(mut self) {
        if !self.finished {
            self.finish();
            self.client.abort(self.rid);
        }
    }

    fn finish(&mut self) {
        self.finished = true;
        self.slot = None;
    }
}

impl Drop for RequestStream {
    /// A client that disconnects drops its handler's future, and with it this stream: the
    /// worker frees the request at once, and it is counted as a disconnect.
    fn drop(&mut self) {
        if !self.finished {
            self.finish();
            self.client.abort_disconnected(self.rid);
        }
    }
}
