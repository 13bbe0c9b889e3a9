//! Against clients that do not read their answers: each request holds a ticket of the
//! service's request caps until its answer's body is sent (or its connection is gone), and a
//! connection whose client takes nothing for `connections.send_timeout` is closed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

use super::error::ApiError;
use super::shared::Shared;
use crate::service::{Caller, Ticket};

/// Admits the request under the caller's and the server's caps (429 past them); the ticket
/// goes with the answer's body, so an answer still being sent counts.
pub async fn admit(State(state): State<Shared>, req: Request, next: Next) -> Response {
    // Health checks are answered whatever the load.
    let counted = req.uri().path() != "/healthz";
    let caller = req.extensions().get::<Caller>().cloned();
    let ticket = match caller.filter(|_| counted) {
        Some(caller) => match state.admit_request(&caller) {
            Ok(ticket) => Some(ticket),
            Err(e) => return ApiError::from(e).into_response(),
        },
        None => None,
    };
    let response = next.run(req).await;
    match ticket {
        Some(ticket) => response.map(|body| {
            Body::new(Held {
                body,
                _ticket: ticket,
            })
        }),
        None => response,
    }
}

/// A body that holds its request's ticket until it is sent or dropped.
struct Held {
    body: Body,
    _ticket: Ticket,
}

impl http_body::Body for Held {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The server's listener: its connections fail their writes once they make no progress for
/// `timeout`, and the server then closes them (with the answer or stream they carried).
#[derive(Debug)]
pub struct Listener {
    pub inner: TcpListener,
    pub timeout: Duration,
}

impl axum::serve::Listener for Listener {
    type Io = SendTimeout<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        (SendTimeout::new(io, self.timeout), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection whose writes time out: a write (or flush) that has been waiting for the
/// client to read for `limit` fails with `TimedOut`. Reads are as they were: a client may
/// think as long as it likes before it sends.
#[derive(Debug)]
pub struct SendTimeout<T> {
    io: T,
    limit: Duration,
    /// Set while a write waits; any progress clears it.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> SendTimeout<T> {
    pub fn new(io: T, limit: Duration) -> SendTimeout<T> {
        SendTimeout {
            io,
            limit,
            stalled: None,
        }
    }

    /// What a write that returned `polled` comes to: past the limit of waiting, an error.
    fn watch<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of its answer for connections.send_timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A peer that never reads: the writer fails with `TimedOut` once the socket's buffers
    /// are full and the limit has passed, instead of waiting forever.
    #[tokio::test]
    async fn a_write_nobody_reads_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = TcpStream::connect(addr).await.unwrap();
        let (io, _) = listener.accept().await.unwrap();
        let mut io = SendTimeout::new(io, Duration::from_millis(200));
        let chunk = vec![0u8; 1 << 20];
        let err = loop {
            if let Err(e) = io.write_all(&chunk).await {
                break e;
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        drop(peer);
    }
}
