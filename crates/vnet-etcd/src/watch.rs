//! Watches: one stream carrying several key ranges, read message by message.

use crate::error::status_error;
use crate::held::ReleaseOnDrop;
use crate::{codec, pb, Client, Error, Meta, WatchMessage, MAX_WATCH_MESSAGE_LEN};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::StreamExt as _;

impl Client {
    /// Watches the keys from `key` up to `range_end` from `start_revision` (0: from now).
    pub fn watch(
        &self,
        key: &[u8],
        range_end: Option<&[u8]>,
        start_revision: i64,
    ) -> Result<Watch, Error> {
        let end = range_end.map(<[u8]>::to_vec);
        self.watch_ranges(&[(key.to_vec(), end)], start_revision)
    }

    /// Watches several key ranges on one stream (one create request each), so a watcher can
    /// leave out keys it has no use for without a stream per range. The call waits (at most
    /// the call timeout, per endpoint) for the server to take the stream.
    pub fn watch_ranges(
        &self,
        ranges: &[(Vec<u8>, Option<Vec<u8>>)],
        start_revision: i64,
    ) -> Result<Watch, Error> {
        if self.user.is_some() && self.token().is_none() {
            self.authenticate()?;
        }
        let creates: Vec<pb::WatchRequest> = ranges
            .iter()
            .map(|(k, e)| codec::watch_create_request(k, e.as_deref(), start_revision))
            .collect();
        let held = ReleaseOnDrop::new();
        let start = self.current.load(Relaxed);
        let n = self.endpoints.len();
        let mut last = String::new();
        for k in 0..n {
            let i = (start + k) % n;
            let started = self.call_at(i, self.call_timeout(), &|ch| {
                // The request side stays open for as long as the watch (a stream closed by its
                // client is one etcd's gRPC proxy tears down), and ends when it is dropped.
                let requests = tokio_stream::iter(creates.clone()).chain(held.stream());
                let r = self.request(requests, Meta::TokenLeader);
                async move {
                    let s = pb::watch_client::WatchClient::new(ch)
                        .max_decoding_message_size(MAX_WATCH_MESSAGE_LEN)
                        .watch(r)
                        .await?;
                    Ok(s.into_inner())
                }
            });
            match started {
                Ok(stream) => {
                    return Ok(Watch {
                        rt: self.rt.clone(),
                        stream,
                        _held: held,
                        endpoint: i,
                        base: self.endpoints[i].clone(),
                    })
                }
                Err(Error::Unreachable(e)) => last = e,
                Err(e) => return Err(e), // `held` ends the attempts' streams
            }
        }
        Err(Error::Unreachable(last))
    }
}

/// An open watch: each [`Watch::next_message`] blocks until the server sends something.
/// Dropping it ends the stream on the server.
pub struct Watch {
    rt: Arc<tokio::runtime::Runtime>,
    stream: tonic::Streaming<pb::WatchResponse>,
    /// Ends the stream's request side when the watch is dropped.
    _held: ReleaseOnDrop,
    endpoint: usize,
    /// The endpoint's URL, for errors.
    base: String,
}

impl Watch {
    /// The index (in [`Client::endpoints`]) of the endpoint serving this watch.
    pub fn endpoint(&self) -> usize {
        self.endpoint
    }

    /// The next message; an error when the stream broke, ended or sent something bad (the
    /// watch is then useless: re-read and watch again).
    pub fn next_message(&mut self) -> Result<WatchMessage, Error> {
        let message = self.rt.block_on(self.stream.message());
        self.decode(message)
    }

    /// As [`Watch::next_message`], waiting at most `wait` (None: nothing came), so that a
    /// reader can close a watch it no longer needs although nothing happens.
    pub fn next_message_within(&mut self, wait: Duration) -> Result<Option<WatchMessage>, Error> {
        let (rt, stream) = (&self.rt, &mut self.stream);
        match rt.block_on(async { tokio::time::timeout(wait, stream.message()).await }) {
            Ok(message) => self.decode(message).map(Some),
            Err(_elapsed) => Ok(None),
        }
    }

    fn decode(
        &self,
        message: Result<Option<pb::WatchResponse>, tonic::Status>,
    ) -> Result<WatchMessage, Error> {
        match message {
            Ok(Some(m)) => Ok(codec::watch_message(m)?),
            Ok(None) => Err(Error::WatchEnded("closed by the server".into())),
            Err(s) => Err(match status_error(&self.base, &s) {
                Error::Unreachable(e) => Error::WatchEnded(e),
                e => e,
            }),
        }
    }
}
