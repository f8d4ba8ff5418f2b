//! The dashboard's HTTP/1.1 server, bounded in every dimension a client controls.
//!
//! One thread (the caller's) holds every connection: it accepts, reads the bytes as they
//! arrive (mio's readiness polling: epoll, kqueue), parses a request once its head is complete
//! (httparse), and writes the answers; a fixed pool of workers turns complete requests into
//! answers. So an idle, slow or endless client costs a buffer of at most
//! [`MAX_HEAD`] + [`MAX_BODY`] bytes on that one thread, never a thread of its own, and the
//! workers only ever wait for the database.
//!
//! The bounds: at most [`MAX_CONNECTIONS`] open connections (a new one past it closes the
//! oldest still sending its request, so a flood of idle connections cannot lock others out);
//! a request's head and body within [`REQUEST_DEADLINE`] of the connection's accept (else 408
//! and closed), a head of at most [`MAX_HEAD`] bytes (else 431) and a body of at most
//! [`MAX_BODY`] with a `Content-Length` (else 413); an answer written within
//! [`WRITE_DEADLINE`]; at most [`QUEUE`] requests waiting for a worker (else 503). One request
//! per connection (`Connection: close`). The requests answered from memory alone ([`Quick`])
//! have workers and a queue of their own, so requests that wait on the database cannot starve
//! them.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, TrySendError};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

/// The most connections open at once.
pub(crate) const MAX_CONNECTIONS: usize = 512;
/// The largest request head (request line and headers) read.
pub(crate) const MAX_HEAD: usize = 16 * 1024;
/// The largest request body accepted: the forms send short fields, but one acting on every
/// job matching a filter carries it twice (its fields and the way back), with up to
/// `sqlbroker::MAX_FILTER_TEXT` bytes of error text, URL-encoded.
pub(crate) const MAX_BODY: usize = 8 * 1024;
/// The most header lines in a head.
const MAX_HEADERS: usize = 64;
/// A connection's whole request, head and body, arrives within this of its accept.
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// An answer is written within this (the pages are a few tens of KiB: the socket buffers
/// take them at once unless the client stops reading).
pub(crate) const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// Complete requests waiting for a worker, at most.
const QUEUE: usize = 64;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);

/// A request's method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Method {
    Get,
    Head,
    Post,
    Other(String),
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Other(m) => m,
        })
    }
}

/// A complete request.
pub(crate) struct Request {
    pub method: Method,
    /// The request target as sent (`/tables/jobs?state=dead`).
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The client's address.
    pub peer: IpAddr,
}

/// What answers requests.
pub(crate) type Handler = dyn Fn(Request) -> Answer + Send + Sync;

/// A handler's answer: a complete response's bytes ([`response`]), and how long to hold them
/// back before writing (a throttled failure: the polling thread holds the connection, no
/// worker waits).
pub(crate) struct Answer {
    pub bytes: Vec<u8>,
    pub hold: Duration,
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        303 => "See Other",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// A response's bytes: status line, `headers` (any with a control character in it is left
/// out: no header injection), `Content-Length`, `Connection: close`, then `body` unless
/// `head_only` (a `HEAD` request).
pub(crate) fn response(
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
    head_only: bool,
) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        if name.chars().chain(value.chars()).any(char::is_control) {
            continue;
        }
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

/// The server's own short answers (refusals before a request reaches a worker).
fn plain(status: u16, text: &str) -> Vec<u8> {
    response(
        status,
        &[
            ("Content-Type", "text/plain; charset=utf-8".into()),
            ("Cache-Control", "no-store".into()),
        ],
        format!("{text}\n").as_bytes(),
        false,
    )
}

enum State {
    /// The request's bytes so far ([`Incoming`]).
    Reading(Incoming),
    /// A worker has the request.
    Working,
    /// The answer, and how much of it is written.
    Writing(Vec<u8>, usize),
    /// The answer, held back until the instant (a throttled failure).
    Held(Vec<u8>, Instant),
}

struct Conn {
    stream: TcpStream,
    peer: IpAddr,
    state: State,
    /// When it was accepted (reading) or its answer began (writing).
    since: Instant,
}

/// What reading a connection came to.
enum Read_ {
    /// More bytes to wait for.
    Wait,
    /// A complete request.
    Done(Request),
    /// An answer without a worker (a refusal), then close.
    Refuse(Vec<u8>),
    /// The client went away.
    Gone,
}

/// Tells a request answered from memory alone (the counts the sampler keeps: `/metrics`, the
/// overview a monitor checks), which [`serve`] gives workers of their own.
pub(crate) type Quick = fn(&Request) -> bool;

/// Worker threads of the requests [`Quick`] picks.
const QUICK_WORKERS: usize = 2;

/// Starts `n` worker threads named `name-<i>` answering the requests of `rx` through
/// `handler`, each answer sent to `tx` and the poll woken.
fn workers(
    name: &str,
    n: usize,
    rx: &crossbeam_channel::Receiver<(Token, Request)>,
    tx: &crossbeam_channel::Sender<(Token, Answer)>,
    waker: &Arc<Waker>,
    handler: &Arc<Handler>,
) -> std::io::Result<()> {
    for i in 0..n.max(1) {
        let (rx, tx, waker, handler) = (
            rx.clone(),
            tx.clone(),
            Arc::clone(waker),
            Arc::clone(handler),
        );
        std::thread::Builder::new()
            .name(format!("{name}-{i}"))
            .spawn(move || {
                for (token, rq) in rx {
                    let out =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(rq)))
                            .unwrap_or_else(|_| Answer {
                                bytes: plain(500, "the page failed (see the log)"),
                                hold: Duration::ZERO,
                            });
                    if tx.send((token, out)).is_err() {
                        return;
                    }
                    let _ = waker.wake();
                }
            })?;
    }
    Ok(())
}

/// Serves `listener` for ever, `workers` threads answering through `handler`, and
/// [`QUICK_WORKERS`] more answering the requests `quick` picks (those read memory only, so
/// listings that wait on the database never hold up `/metrics` or a health check); returns
/// only if polling the sockets fails.
pub(crate) fn serve(
    listener: std::net::TcpListener,
    n_workers: usize,
    handler: Arc<Handler>,
    quick: Quick,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut listener = TcpListener::from_std(listener);
    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let (work_tx, work_rx) = bounded::<(Token, Request)>(QUEUE);
    let (quick_tx, quick_rx) = bounded::<(Token, Request)>(QUEUE);
    let (done_tx, done_rx) = unbounded::<(Token, Answer)>();
    workers(
        "sqlbroker-dashboard",
        n_workers,
        &work_rx,
        &done_tx,
        &waker,
        &handler,
    )?;
    workers(
        "sqlbroker-dashboard-quick",
        QUICK_WORKERS,
        &quick_rx,
        &done_tx,
        &waker,
        &handler,
    )?;
    let mut conns: HashMap<Token, Conn> = HashMap::new();
    let mut next_token = 2usize;
    let mut events = Events::with_capacity(256);
    // Connections may be waiting in the backlog (the last accept stopped on an error, such as
    // too many open files): try again soon.
    let mut pending = false;
    loop {
        // A held answer is written on time: the poll wakes for the first one due.
        let first_held = conns
            .values()
            .filter_map(|c| match c.state {
                State::Held(_, at) => Some(at),
                _ => None,
            })
            .min();
        let tick = Duration::from_millis(if pending { 50 } else { 250 }).min(
            first_held.map_or(Duration::MAX, |at| {
                at.saturating_duration_since(Instant::now())
            }),
        );
        if let Err(e) = poll.poll(&mut events, Some(tick)) {
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let mut touched: Vec<Token> = Vec::new();
        for ev in events.iter() {
            match ev.token() {
                LISTENER => pending = true,
                WAKER => {}
                t => touched.push(t),
            }
        }
        if pending {
            pending = accept(&listener, &poll, &mut conns, &mut next_token);
        }
        let now = Instant::now();
        while let Ok((token, out)) = done_rx.try_recv() {
            if let Some(c) = conns.get_mut(&token) {
                c.state = match out.hold.is_zero() {
                    true => State::Writing(out.bytes, 0),
                    false => State::Held(out.bytes, now + out.hold),
                };
                c.since = now;
                touched.push(token);
            }
        }
        for (token, c) in conns.iter_mut() {
            if let State::Held(_, at) = c.state {
                if at <= now {
                    if let State::Held(out, _) = std::mem::replace(&mut c.state, State::Working) {
                        c.state = State::Writing(out, 0);
                    }
                    c.since = now;
                    touched.push(*token);
                }
            }
        }
        for token in touched {
            let Some(c) = conns.get_mut(&token) else {
                continue;
            };
            if let State::Reading(..) = c.state {
                match read(c) {
                    Read_::Wait => {}
                    Read_::Gone => {
                        close(&poll, &mut conns, token);
                        continue;
                    }
                    Read_::Refuse(out) => {
                        c.state = State::Writing(out, 0);
                        c.since = now;
                    }
                    Read_::Done(rq) => {
                        match if quick(&rq) { &quick_tx } else { &work_tx }.try_send((token, rq)) {
                            Ok(()) => c.state = State::Working,
                            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                                c.state = State::Writing(
                                    plain(503, "the dashboard is busy: try again in a moment"),
                                    0,
                                );
                                c.since = now;
                            }
                        }
                    }
                }
            }
            if let Some(c) = conns.get_mut(&token) {
                if let State::Writing(..) = c.state {
                    if write(c) {
                        close(&poll, &mut conns, token);
                    }
                }
            }
        }
        // Deadlines: a request not complete in time gets a 408 (if the socket takes it at
        // once), an answer not taken in time is dropped.
        let late: Vec<Token> = conns
            .iter()
            .filter(|(_, c)| match c.state {
                State::Reading(..) => now.duration_since(c.since) >= REQUEST_DEADLINE,
                State::Writing(..) => now.duration_since(c.since) >= WRITE_DEADLINE,
                State::Working | State::Held(..) => false,
            })
            .map(|(t, _)| *t)
            .collect();
        for token in late {
            if let Some(c) = conns.get_mut(&token) {
                if let State::Reading(..) = c.state {
                    let _ = c.stream.write(&plain(
                        408,
                        "the request did not arrive in time: closing the connection",
                    ));
                }
            }
            close(&poll, &mut conns, token);
        }
    }
}

/// Accepts what the backlog holds; true if it stopped on an error (try again soon).
fn accept(
    listener: &TcpListener,
    poll: &Poll,
    conns: &mut HashMap<Token, Conn>,
    next_token: &mut usize,
) -> bool {
    loop {
        let (mut stream, addr) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                log::warn!("dashboard: accepting a connection: {e}");
                return true;
            }
        };
        if conns.len() >= MAX_CONNECTIONS {
            // The oldest connection still sending its request makes room, else the oldest
            // whose answer is held back (a throttled failure: held connections cannot crowd
            // the others out); with none (every one is being answered), the new one is
            // closed at once.
            let oldest = |held: bool| {
                conns
                    .iter()
                    .filter(|(_, c)| match c.state {
                        State::Reading(..) => !held,
                        State::Held(..) => held,
                        _ => false,
                    })
                    .min_by_key(|(_, c)| c.since)
                    .map(|(t, _)| *t)
            };
            let oldest = oldest(false).or_else(|| oldest(true));
            match oldest {
                Some(t) => close(poll, conns, t),
                None => continue,
            }
        }
        // The answer goes out in one write: no Nagle delay for its last segment.
        let _ = stream.set_nodelay(true);
        let token = Token(*next_token);
        *next_token = next_token.checked_add(1).unwrap_or(2).max(2);
        if poll
            .registry()
            .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
            .is_err()
        {
            continue;
        }
        conns.insert(
            token,
            Conn {
                stream,
                peer: addr.ip(),
                state: State::Reading(Incoming::default()),
                since: Instant::now(),
            },
        );
    }
}

fn close(poll: &Poll, conns: &mut HashMap<Token, Conn>, token: Token) {
    if let Some(mut c) = conns.remove(&token) {
        let _ = poll.registry().deregister(&mut c.stream);
        let _ = c.stream.shutdown(Shutdown::Both);
    }
}

/// Reads what has arrived (never more than a head and a body can hold).
fn read(c: &mut Conn) -> Read_ {
    let State::Reading(incoming) = &mut c.state else {
        return Read_::Wait;
    };
    let mut chunk = [0u8; 4096];
    loop {
        let room = (MAX_HEAD + MAX_BODY + 1).saturating_sub(incoming.buf.len());
        let want = room.min(chunk.len());
        if want == 0 {
            return Read_::Refuse(plain(431, "the request is too large"));
        }
        match c.stream.read(&mut chunk[..want]) {
            Ok(0) => return Read_::Gone,
            Ok(n) => match incoming.push(&chunk[..n], c.peer) {
                Read_::Wait => {}
                other => return other,
            },
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Read_::Wait,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Read_::Gone,
        }
    }
}

/// A request as its bytes arrive: the bytes so far, whether they hold the end of the head,
/// and the head once parsed (a body sent a byte at a time is not a parse of the head per
/// byte).
#[derive(Default)]
struct Incoming {
    buf: Vec<u8>,
    ended: bool,
    /// The head, once whole and parsed.
    head: Option<Head>,
    /// Heads parsed (a test counts them).
    parses: u32,
}

impl Incoming {
    /// Takes the bytes that arrived: a complete request, a refusal, or more to wait for.
    fn push(&mut self, bytes: &[u8], peer: IpAddr) -> Read_ {
        // Only the new bytes (and the three before) are searched for the head's end, so a
        // head sent a byte at a time costs its length once, not squared.
        let from = self.buf.len().saturating_sub(3);
        self.buf.extend_from_slice(bytes);
        let new = &self.buf[from..];
        self.ended = self.ended
            || new.windows(4).any(|w| w == b"\r\n\r\n")
            || new.windows(2).any(|w| w == b"\n\n");
        if !self.ended {
            if self.buf.len() > MAX_HEAD {
                return Read_::Refuse(plain(
                    431,
                    &format!("a request head may have at most {MAX_HEAD} bytes"),
                ));
            }
            return Read_::Wait;
        }
        if self.head.is_none() {
            self.parses += 1;
            match parse_head(&self.buf) {
                Ok(head) => self.head = head,
                Err(refusal) => return Read_::Refuse(refusal),
            }
        }
        // The head is parsed once; the bytes after it only fill the body.
        match &self.head {
            Some(head) => head
                .request(&self.buf, peer)
                .map_or(Read_::Wait, Read_::Done),
            None => Read_::Wait,
        }
    }
}

/// A request's head, parsed: what it asks and how long its body is.
struct Head {
    method: Method,
    target: String,
    headers: Vec<(String, String)>,
    /// The head's length in bytes (the body starts there).
    len: usize,
    /// The body's length (`Content-Length`, 0 without one).
    body: usize,
}

impl Head {
    /// The request, if `buf` holds its whole body.
    fn request(&self, buf: &[u8], peer: IpAddr) -> Option<Request> {
        let body = buf.get(self.len..self.len + self.body)?;
        Some(Request {
            method: self.method.clone(),
            target: self.target.clone(),
            headers: self.headers.clone(),
            body: body.to_vec(),
            peer,
        })
    }
}

/// The request in `buf`, if complete (what [`Incoming`] does as the bytes arrive).
#[cfg(test)]
fn parse(buf: &[u8], peer: IpAddr) -> Read_ {
    match parse_head(buf) {
        Ok(Some(head)) => head.request(buf, peer).map_or(Read_::Wait, Read_::Done),
        Ok(None) => Read_::Wait,
        Err(refusal) => Read_::Refuse(refusal),
    }
}

/// The head at the start of `buf`: `None` while it is not whole; a refusal's bytes for a head
/// over the bounds or malformed, or a body that cannot be read (no `Content-Length` a
/// request may carry: one header of digits, at most [`MAX_BODY`]).
fn parse_head(buf: &[u8]) -> Result<Option<Head>, Vec<u8>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD => n,
        Ok(httparse::Status::Complete(_)) | Err(httparse::Error::TooManyHeaders) => {
            return Err(plain(
                431,
                &format!(
                    "a request head may have at most {MAX_HEAD} bytes and {MAX_HEADERS} headers"
                ),
            ))
        }
        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => return Ok(None),
        Ok(httparse::Status::Partial) => {
            return Err(plain(
                431,
                &format!("a request head may have at most {MAX_HEAD} bytes"),
            ))
        }
        Err(e) => return Err(plain(400, &format!("a malformed request: {e}"))),
    };
    let headers: Vec<(String, String)> = req
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    let too_large = || {
        plain(
            413,
            &format!("a request body may have at most {MAX_BODY} bytes, with a Content-Length"),
        )
    };
    if has("transfer-encoding") || has("expect") {
        return Err(too_large());
    }
    // One Content-Length of digits only: two (even equal: a proxy in front may have read the
    // other one) or a sign leave the body's end in doubt (request smuggling), RFC 9112 6.3.
    let mut lengths = headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.trim_matches([' ', '\t']));
    let length = match (lengths.next(), lengths.next()) {
        (None, _) => 0,
        (Some(_), Some(_)) => return Err(plain(400, "more than one Content-Length")),
        (Some(v), None) if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) => {
            return Err(plain(400, "a malformed Content-Length"))
        }
        (Some(v), None) => match v.parse::<usize>() {
            Ok(n) if n <= MAX_BODY => n,
            _ => return Err(too_large()),
        },
    };
    let method = match req.method.unwrap_or("") {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        other => Method::Other(other.to_string()),
    };
    Ok(Some(Head {
        method,
        target: req.path.unwrap_or("/").to_string(),
        headers,
        len: head_len,
        body: length,
    }))
}

/// Writes what the socket takes; true when the answer is out (or the client gone).
fn write(c: &mut Conn) -> bool {
    let State::Writing(out, at) = &mut c.state else {
        return false;
    };
    while *at < out.len() {
        match c.stream.write(&out[*at..]) {
            Ok(0) => return true,
            Ok(n) => *at += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
    let _ = c.stream.flush();
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> IpAddr {
        IpAddr::from([127, 0, 0, 1])
    }

    #[test]
    fn heads_parse_once_complete_and_are_bounded() {
        let rq = b"GET /tables/x?state=dead HTTP/1.1\r\nHost: localhost\r\n\r\n";
        assert!(matches!(parse(&rq[..20], peer()), Read_::Wait));
        match parse(rq, peer()) {
            Read_::Done(r) => {
                assert_eq!(r.method, Method::Get);
                assert_eq!(r.target, "/tables/x?state=dead");
                assert_eq!(r.headers, [("Host".to_string(), "localhost".to_string())]);
            }
            _ => panic!("a complete head"),
        }
        let post = b"POST /login HTTP/1.1\r\nContent-Length: 5\r\n\r\ntok";
        assert!(matches!(parse(post, peer()), Read_::Wait), "body pending");
        let post = b"POST /login HTTP/1.1\r\nContent-Length: 5\r\n\r\ntoken";
        assert!(matches!(parse(post, peer()), Read_::Done(r) if r.body == b"token"));
        let status = |out: Read_| match out {
            Read_::Refuse(bytes) => String::from_utf8_lossy(&bytes[..12]).into_owned(),
            _ => "no refusal".into(),
        };
        let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
        long.resize(MAX_HEAD + 1, b'a');
        assert_eq!(status(parse(&long, peer())), "HTTP/1.1 431");
        let big = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert_eq!(status(parse(big.as_bytes(), peer())), "HTTP/1.1 413");
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(status(parse(chunked, peer())), "HTTP/1.1 413");
        assert_eq!(
            status(parse(b"\x01\x02 / HTTP/1.1\r\n\r\n", peer())),
            "HTTP/1.1 400"
        );
    }

    /// A `Content-Length` is one header of digits only: a second one (equal or not: a proxy
    /// in front may have read the other) and a sign are refused, as RFC 9112 asks of a
    /// server that cannot tell which length is meant.
    #[test]
    fn content_length_is_one_header_of_digits() {
        let status = |raw: &[u8]| match parse(raw, peer()) {
            Read_::Refuse(bytes) => String::from_utf8_lossy(&bytes[..12]).into_owned(),
            Read_::Done(_) => "done".into(),
            _ => "no refusal".into(),
        };
        for bad in [
            &b"POST /login HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\ntoken"[..],
            b"POST /login HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 3\r\n\r\ntoken",
            b"POST /login HTTP/1.1\r\nContent-Length: +5\r\n\r\ntoken",
            b"POST /login HTTP/1.1\r\nContent-Length: -0\r\n\r\n",
            b"POST /login HTTP/1.1\r\nContent-Length: 5,5\r\n\r\ntoken",
            b"POST /login HTTP/1.1\r\nContent-Length: \r\n\r\n",
        ] {
            // Fails where the length is taken (a sign parsed, the first header used).
            assert_eq!(
                status(bad),
                "HTTP/1.1 400",
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            status(b"POST /login HTTP/1.1\r\nContent-Length:  5 \r\n\r\ntoken"),
            "done",
            "spaces around the digits are the header's"
        );
    }

    /// A request whose body arrives a byte at a time is parsed once, when its head is whole:
    /// the bytes after it are counted against the `Content-Length`, not parsed again.
    #[test]
    fn a_body_a_byte_at_a_time_parses_the_head_once() {
        let body = vec![b'x'; MAX_BODY];
        let mut head = format!("POST /login HTTP/1.1\r\nContent-Length: {}\r\n", body.len());
        // A long head, within the bounds (60 headers, under 16 KiB).
        for _ in 0..60 {
            head.push_str(&format!("X-Pad: {}\r\n", "a".repeat(250)));
        }
        assert!(head.len() < MAX_HEAD);
        head.push_str("\r\n");
        let mut incoming = Incoming::default();
        for b in head.as_bytes() {
            assert!(matches!(incoming.push(&[*b], peer()), Read_::Wait));
        }
        for b in &body[..body.len() - 1] {
            assert!(matches!(incoming.push(&[*b], peer()), Read_::Wait));
        }
        match incoming.push(&body[body.len() - 1..], peer()) {
            Read_::Done(r) => assert_eq!(r.body, body),
            _ => panic!("the request is whole"),
        }
        // Fails if the head is parsed again for every byte of the body (8,193 parses).
        assert_eq!(incoming.parses, 1);
    }

    #[test]
    fn responses_leave_out_headers_with_control_characters() {
        let out = response(
            303,
            &[
                ("Location", "/a\r\nSet-Cookie: x=1".into()),
                ("X-Ok", "yes".into()),
            ],
            b"body",
            false,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("Set-Cookie"), "{text}");
        assert!(text.starts_with("HTTP/1.1 303 See Other\r\nX-Ok: yes\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody"), "{text}");
        let head = response(200, &[], b"body", true);
        assert!(String::from_utf8(head)
            .unwrap()
            .ends_with("Content-Length: 4\r\nConnection: close\r\n\r\n"));
    }
}
