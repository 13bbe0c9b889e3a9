//! The client's side of an intercepted connection, as a stream of HTTP/1.1 requests: each
//! head is parsed and its header values rewritten, each body framed (Content-Length or
//! chunked) and passed on verbatim, so that the next request on a kept-alive connection is
//! found and rewritten too. Responses are never parsed.

use httparse::{Request, Status, EMPTY_HEADER};

use super::secrets::{replace, Place, SecretEvent, SecretEventKind, Secrets};
use crate::http_head::MAX_HEAD;

/// The longest chunk-size or trailer line taken.
const MAX_LINE: usize = 4096;
const MAX_HEADERS: usize = 256;

/// Why the request stream cannot be carried on (the connection is then closed).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RequestError {
    #[error("an unreadable request head: {0}")]
    Head(String),
    #[error("a request head over {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("an ambiguous or unreadable body length")]
    Framing,
    #[error("a malformed chunked body")]
    Chunk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    /// Body bytes left of a Content-Length body.
    Fixed(u64),
    /// A chunked body: at a chunk-size line, in a chunk's data (bytes left), at the CRLF
    /// after it, or in the trailers.
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
    /// After an `Upgrade` or CONNECT request: what follows is not HTTP any more, and passes
    /// unchanged (a placeholder in it stays one).
    Opaque,
}

/// The rewriting state of one intercepted connection's requests.
pub(crate) struct Requests<'a> {
    secrets: &'a Secrets,
    to: Place,
    state: State,
    buf: Vec<u8>,
    /// Injections and misuses seen, for the owner.
    pub events: Vec<SecretEvent>,
}

impl<'a> Requests<'a> {
    pub(crate) fn new(secrets: &'a Secrets, to: Place) -> Requests<'a> {
        Requests {
            secrets,
            to,
            state: State::Head,
            buf: vec![],
            events: vec![],
        }
    }

    /// Takes `input` from the client; appends to `out` what goes upstream.
    pub(crate) fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), RequestError> {
        self.buf.extend_from_slice(input);
        while !self.buf.is_empty() {
            if !self.step(out)? {
                break;
            }
        }
        Ok(())
    }

    /// One step on the buffered bytes; whether it consumed anything.
    fn step(&mut self, out: &mut Vec<u8>) -> Result<bool, RequestError> {
        match self.state {
            State::Head => self.head(out),
            State::Fixed(n) | State::ChunkData(n) => {
                let take = self.buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
                out.extend(self.buf.drain(..take));
                let left = n - take as u64;
                self.state = match (self.state, left) {
                    (State::Fixed(_), 0) => State::Head,
                    (State::Fixed(_), l) => State::Fixed(l),
                    (_, 0) => State::ChunkEnd,
                    (_, l) => State::ChunkData(l),
                };
                Ok(true)
            }
            State::ChunkSize => self.chunk_size(out),
            State::ChunkEnd => {
                if self.buf.len() < 2 {
                    return Ok(false);
                }
                if &self.buf[..2] != b"\r\n" {
                    return Err(RequestError::Chunk);
                }
                out.extend(self.buf.drain(..2));
                self.state = State::ChunkSize;
                Ok(true)
            }
            State::Trailers => self.trailer(out),
            State::Opaque => {
                out.append(&mut self.buf);
                Ok(true)
            }
        }
    }

    fn chunk_size(&mut self, out: &mut Vec<u8>) -> Result<bool, RequestError> {
        match httparse::parse_chunk_size(&self.buf) {
            Ok(Status::Complete((len, size))) => {
                out.extend(self.buf.drain(..len));
                self.state = if size == 0 {
                    State::Trailers
                } else {
                    State::ChunkData(size)
                };
                Ok(true)
            }
            Ok(Status::Partial) if self.buf.len() <= MAX_LINE => Ok(false),
            _ => Err(RequestError::Chunk),
        }
    }

    /// One trailer line (not rewritten: trailers are rare and a placeholder there goes out
    /// as one); the empty line ends the request.
    fn trailer(&mut self, out: &mut Vec<u8>) -> Result<bool, RequestError> {
        let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") else {
            if self.buf.len() > MAX_LINE {
                return Err(RequestError::Chunk);
            }
            return Ok(false);
        };
        out.extend(self.buf.drain(..end + 2));
        if end == 0 {
            self.state = State::Head;
        }
        Ok(true)
    }

    fn head(&mut self, out: &mut Vec<u8>) -> Result<bool, RequestError> {
        let mut slots = [EMPTY_HEADER; MAX_HEADERS];
        let mut req = Request::new(&mut slots);
        let len = match req.parse(&self.buf) {
            Ok(Status::Complete(len)) if len <= MAX_HEAD => len,
            Ok(Status::Partial) if self.buf.len() <= MAX_HEAD => return Ok(false),
            Ok(_) => return Err(RequestError::HeadTooLarge),
            Err(e) => return Err(RequestError::Head(e.to_string())),
        };
        let next = framing(&req)?;
        out.extend_from_slice(&rewrite(self.secrets, &self.to, &req, &mut self.events));
        let misused = self.secrets.misuses(&self.buf[..len], &self.to, MISUSE);
        self.events.extend(misused);
        self.buf.drain(..len);
        self.state = next;
        Ok(true)
    }
}

/// The head as it goes upstream (`to`): the placeholders of the secrets that may go there
/// replaced in header values (one injection event per secret used, added to `events`).
fn rewrite(secrets: &Secrets, to: &Place, req: &Request, events: &mut Vec<SecretEvent>) -> Vec<u8> {
    let mut out = format!(
        "{} {} HTTP/1.{}\r\n",
        req.method.unwrap_or_default(),
        req.path.unwrap_or_default(),
        req.version.unwrap_or(1)
    )
    .into_bytes();
    let mine: Vec<_> = (secrets.0.iter())
        .filter(|s| s.goes_to(&to.host, to.port))
        .collect();
    let mut used = vec![false; mine.len()];
    for h in req.headers.iter() {
        let mut value = h.value.to_vec();
        for (i, s) in mine.iter().enumerate() {
            if let Some(v) = replace(&value, s.placeholder.as_bytes(), s.value.bytes()) {
                value = v;
                used[i] = true;
            }
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(&value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    for (s, _) in mine.iter().zip(&used).filter(|(_, u)| **u) {
        events.push(to.event(SecretEventKind::Injected, s, INJECTED));
    }
    out
}

const INJECTED: &str = "injected in a request header";
const MISUSE: &str = "placeholder sent to a host that is not the secret's: not replaced";

/// What follows a request head (RFC 9112 §6.3): chunked if its last transfer coding is,
/// else Content-Length's bytes, else nothing. Both, or a length that differs from another,
/// is refused: a server could frame the request otherwise, and smuggle one past the rewrite.
fn framing(req: &Request) -> Result<State, RequestError> {
    let values = |name: &'static str| {
        req.headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    let te: Vec<String> = values("transfer-encoding").collect();
    let cl: Vec<String> = values("content-length").collect();
    let method = req.method.unwrap_or_default();
    let upgrade = values("upgrade").next().is_some() || method.eq_ignore_ascii_case("CONNECT");
    let body = match (te.is_empty(), cl.as_slice()) {
        (false, []) => {
            let last = te.join(",");
            let last = last.rsplit(',').next().map(str::trim);
            if last != Some("chunked") {
                return Err(RequestError::Framing);
            }
            State::ChunkSize
        }
        (false, _) => return Err(RequestError::Framing),
        (true, []) => State::Head,
        (true, [first, rest @ ..]) => {
            if rest.iter().any(|v| v != first) || !first.bytes().all(|b| b.is_ascii_digit()) {
                return Err(RequestError::Framing);
            }
            match first.parse::<u64>() {
                Ok(0) => State::Head,
                Ok(n) => State::Fixed(n),
                Err(_) => return Err(RequestError::Framing),
            }
        }
    };
    // After an upgrade the bytes are another protocol's; its head is checked like any other
    // and the rest passes unchanged.
    Ok(if upgrade { State::Opaque } else { body })
}
