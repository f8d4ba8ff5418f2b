//! A client-side deadline on every round trip to PostgreSQL.
//!
//! The `postgres` driver has no per-query timeout, and its socket is non-blocking under the
//! small tokio runtime it drives each connection with, so `SO_RCVTIMEO` does nothing. TCP
//! keepalive and `TCP_USER_TIMEOUT` (set too, see `mod.rs`) catch a dead peer or a cut
//! network, but not a server, or a proxy, whose kernel accepts and acknowledges the bytes and
//! never answers: a stopped process, a hung host behind a live load balancer. Only a deadline
//! on each round trip does.
//!
//! So every TCP session's stream is wrapped ([`Bounded`]) where the driver hands it to its TLS
//! connector, and [`MakeBounded`] is that connector for every `sslmode`: it negotiates TLS
//! itself as libpq does (the `SSLRequest`, then a rustls handshake, or plain text), since the
//! driver hands the stream to its connector only when it wants TLS. The driver is told
//! `sslmode=require` with `sslnegotiation=direct` (it then skips its own `SSLRequest` and hands
//! the socket straight over); what the URL asked for is what this connector does.
//!
//! A [`Deadline`] is shared by the stream and the session's owner ([`Session`](super::conn)):
//! the owner arms it before a call and disarms it after. While armed, a read or write that
//! would wait past the deadline fails with [`io::ErrorKind::TimedOut`]: the driver ends the
//! connection, the call returns an error, and the session reads as closed and is discarded.
//! Nothing is armed between calls, so a row lock delivery's transaction may stay idle while
//! its handler runs, and the change feed may wait for notifications, as long as they like.
//!
//! The cost per round trip: two atomic stores and a clock read on the caller's side, and, when
//! a read has to wait for the answer, a poll of one timer in the connection's own runtime, which
//! is moved in the runtime's timer wheel about once per bound on a busy session, not once per
//! round trip.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use postgres::Socket;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// When the round trip in progress must be answered by, shared by a session's stream and its
/// owner.
#[derive(Debug, Default)]
pub(super) struct Deadline {
    /// Nanoseconds after [`base`] plus one; 0: nothing armed.
    at: AtomicU64,
    /// The bound armed last, for the error's text.
    within: AtomicU64,
    /// The deadline passed: every read and write fails from then on.
    fired: AtomicBool,
}

/// The instant deadlines are counted from.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

impl Deadline {
    /// The next round trips must be answered within `within` from now.
    pub fn arm(&self, within: Duration) {
        let at = (Instant::now() + within).saturating_duration_since(base());
        let at = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX - 1) + 1;
        self.within.store(
            u64::try_from(within.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.at.store(at, Ordering::Release);
    }

    /// No deadline until the next [`arm`](Deadline::arm).
    pub fn disarm(&self) {
        self.at.store(0, Ordering::Release);
    }

    /// True once a deadline passed with a read or write waiting: the connection is given up.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// The bound armed last.
    pub fn within(&self) -> Duration {
        Duration::from_nanos(self.within.load(Ordering::Relaxed))
    }

    fn error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            NoAnswer {
                within: self.within(),
            },
        )
    }
}

/// The I/O error of a round trip that passed its deadline.
#[derive(Debug)]
pub(super) struct NoAnswer {
    within: Duration,
}

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "timed out after {:?}", self.within)
    }
}

impl std::error::Error for NoAnswer {}

/// A stream whose reads and writes fail once its [`Deadline`] passes while they wait.
pub(super) struct Bounded<S> {
    inner: S,
    deadline: Arc<Deadline>,
    /// The timer, and the deadline (`at`) it is set for: one armed earlier, or the one armed
    /// now ([`Bounded::poll_deadline`]).
    timer: Option<(u64, Pin<Box<Sleep>>)>,
}

impl<S> Bounded<S> {
    fn new(inner: S, deadline: Arc<Deadline>) -> Self {
        Bounded {
            inner,
            deadline,
            timer: None,
        }
    }

    /// An I/O call of the inner stream would wait: the deadline's error if it has passed,
    /// else `Pending` with the task woken when it passes.
    ///
    /// The timer is moved lazily: a later deadline (the next round trip's) keeps the timer set
    /// for an earlier one, which, when it goes off first, is moved to the deadline armed then.
    /// So a busy session moves its timer about once per bound, not once per round trip.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let at = self.deadline.at.load(Ordering::Acquire);
        if at == 0 {
            return Poll::Pending;
        }
        let when = |at: u64| tokio::time::Instant::from_std(base() + Duration::from_nanos(at - 1));
        let (set, timer) = self
            .timer
            .get_or_insert_with(|| (at, Box::pin(tokio::time::sleep_until(when(at)))));
        if at < *set {
            timer.as_mut().reset(when(at));
            *set = at;
        }
        loop {
            match timer.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) if *set == at => {
                    self.deadline.fired.store(true, Ordering::Release);
                    return Poll::Ready(self.deadline.error());
                }
                // An earlier round trip's deadline: on to this one's.
                Poll::Ready(()) => {
                    timer.as_mut().reset(when(at));
                    *set = at;
                }
            }
        }
    }

    /// `poll` of the inner stream, failed once the deadline passed.
    fn bounded<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>>
    where
        S: Unpin,
    {
        if self.deadline.fired() {
            return Poll::Ready(Err(self.deadline.error()));
        }
        match poll(Pin::new(&mut self.inner), cx) {
            Poll::Pending => self.poll_deadline(cx).map(Err),
            ready => ready,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.bounded(cx, |s, cx| s.poll_read(cx, buf))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.bounded(cx, |s, cx| s.poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.bounded(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.bounded(cx, |s, cx| s.poll_shutdown(cx))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.bounded(cx, |s, cx| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// What a session negotiates: plain text, or TLS.
#[derive(Clone)]
enum Negotiate {
    Plain,
    #[cfg(feature = "tls")]
    Tls {
        make: super::tls::MakeRustls,
        /// `require` and the `verify-*` modes: a server without TLS is refused (`prefer`
        /// goes on in plain text).
        required: bool,
        /// `sslnegotiation=direct`: the handshake at once, without the `SSLRequest`.
        direct: bool,
    },
}

/// The driver's TLS connector for every TCP session: it wraps the socket in [`Bounded`] and
/// negotiates TLS as the URL's `sslmode` says. One per connection attempt
/// ([`for_attempt`](MakeBounded::for_attempt)): it leaves the deadline of the session it made
/// in its slot.
#[derive(Clone)]
pub(super) struct MakeBounded {
    /// Only TLS has anything to negotiate.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    negotiate: Negotiate,
    /// The bound of every round trip; the whole exchange after the TCP connect (TLS, startup,
    /// authentication) shares one.
    pub within: Duration,
    /// The deadline of the last socket handed over (the session made, if it succeeded).
    slot: Arc<Mutex<Option<Arc<Deadline>>>>,
}

impl MakeBounded {
    /// A connector that negotiates nothing: `sslmode=disable`, or `prefer` without the `tls`
    /// feature, or `prefer` after a failed handshake.
    pub fn plain(within: Duration) -> Self {
        MakeBounded {
            negotiate: Negotiate::Plain,
            within,
            slot: Arc::default(),
        }
    }

    /// A connector that asks for TLS (`required`: or fails).
    #[cfg(feature = "tls")]
    pub fn tls(
        make: super::tls::MakeRustls,
        required: bool,
        direct: bool,
        within: Duration,
    ) -> Self {
        MakeBounded {
            negotiate: Negotiate::Tls {
                make,
                required,
                direct,
            },
            within,
            slot: Arc::default(),
        }
    }

    /// The same connector with a slot of its own, for one connection attempt.
    pub fn for_attempt(&self) -> Self {
        MakeBounded {
            slot: Arc::default(),
            ..self.clone()
        }
    }

    /// The same connector in plain text (`prefer` after a failed handshake).
    #[cfg(feature = "tls")]
    pub fn without_tls(&self) -> Self {
        MakeBounded::plain(self.within)
    }

    /// The deadline of the session this attempt made.
    pub fn made(&self) -> Option<Arc<Deadline>> {
        self.slot.lock().take()
    }

    /// Whether a failed attempt may be made again in plain text (`prefer`).
    #[cfg(feature = "tls")]
    pub fn falls_back(&self) -> bool {
        matches!(
            self.negotiate,
            Negotiate::Tls {
                required: false,
                ..
            }
        )
    }
}

/// A failure of ours while connecting, as the driver passes it on.
type Failure = Box<dyn std::error::Error + Send + Sync>;

impl MakeTlsConnect<Socket> for MakeBounded {
    type Stream = BoundedStream;
    type TlsConnect = BoundedConnect;
    type Error = Failure;

    /// `domain` is the URL's host (the name a certificate is checked against).
    fn make_tls_connect(&mut self, domain: &str) -> Result<BoundedConnect, Failure> {
        #[cfg(feature = "tls")]
        let tls = match &self.negotiate {
            Negotiate::Plain => None,
            Negotiate::Tls {
                make,
                required,
                direct,
            } => Some((make.connector(domain)?, *required, *direct)),
        };
        #[cfg(not(feature = "tls"))]
        let _ = domain;
        let deadline = Arc::new(Deadline::default());
        // The exchange that follows (TLS, startup, authentication) is bounded as a whole.
        deadline.arm(self.within);
        *self.slot.lock() = Some(deadline.clone());
        Ok(BoundedConnect {
            #[cfg(feature = "tls")]
            tls,
            deadline,
        })
    }
}

/// One session's negotiation.
pub(super) struct BoundedConnect {
    /// The handshake, whether TLS is required, and whether it starts at once.
    #[cfg(feature = "tls")]
    tls: Option<(super::tls::RustlsConnect, bool, bool)>,
    deadline: Arc<Deadline>,
}

/// libpq's `SSLRequest`: length 8, code 80877103.
#[cfg(feature = "tls")]
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

type Negotiation = Pin<Box<dyn Future<Output = Result<BoundedStream, Failure>> + Send>>;

impl TlsConnect<Socket> for BoundedConnect {
    type Stream = BoundedStream;
    type Error = Failure;
    type Future = Negotiation;

    fn connect(self, socket: Socket) -> Negotiation {
        let stream = Bounded::new(socket, self.deadline);
        Box::pin(async move {
            #[cfg(feature = "tls")]
            if let Some((tls, required, direct)) = self.tls {
                return negotiate(stream, tls, required, direct).await;
            }
            Ok(BoundedStream::Plain(stream))
        })
    }
}

/// Asks for TLS as libpq does and runs the handshake; plain text where the server has no TLS
/// and it is not `required`.
#[cfg(feature = "tls")]
async fn negotiate(
    mut stream: Bounded<Socket>,
    tls: super::tls::RustlsConnect,
    required: bool,
    direct: bool,
) -> Result<BoundedStream, Failure> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if !direct {
        stream.write_all(&SSL_REQUEST).await?;
        stream.flush().await?;
        let mut answer = [0u8; 1];
        stream.read_exact(&mut answer).await?;
        if answer[0] != b'S' {
            if required {
                // The driver's own words for it.
                return Err("server does not support TLS".into());
            }
            return Ok(BoundedStream::Plain(stream));
        }
    }
    let tls = tls.connect_over(stream).await?;
    Ok(BoundedStream::Tls(tls))
}

/// A session's stream: plain text or TLS, over a [`Bounded`] socket.
pub(super) enum BoundedStream {
    Plain(Bounded<Socket>),
    #[cfg(feature = "tls")]
    Tls(super::tls::RustlsStream<Bounded<Socket>>),
}

impl TlsStream for BoundedStream {
    /// None: SCRAM runs without channel binding, as in plain text (see `tls.rs`).
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for BoundedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BoundedStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            BoundedStream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BoundedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BoundedStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            BoundedStream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BoundedStream::Plain(s) => Pin::new(s).poll_flush(cx),
            #[cfg(feature = "tls")]
            BoundedStream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BoundedStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            BoundedStream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BoundedStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            #[cfg(feature = "tls")]
            BoundedStream::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            BoundedStream::Plain(s) => s.is_write_vectored(),
            #[cfg(feature = "tls")]
            BoundedStream::Tls(s) => s.is_write_vectored(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A read that waits past an armed deadline fails with `TimedOut` at the deadline (and
    /// every call after it fails too); disarmed, the same read waits for its bytes.
    #[test]
    fn a_read_past_its_deadline_fails() {
        let rt = runtime();
        rt.block_on(async {
            let (a, mut b) = tokio::io::duplex(64);
            let deadline = Arc::new(Deadline::default());
            let mut s = Bounded::new(a, deadline.clone());
            // Nothing armed: the read waits for its bytes, however late.
            let mut one = [0u8; 1];
            let waited = tokio::time::timeout(Duration::from_millis(150), s.read_exact(&mut one));
            assert!(waited.await.is_err(), "an unarmed read gave up");
            assert!(!deadline.fired());
            b.write_all(b"x").await.unwrap();
            s.read_exact(&mut one).await.unwrap();

            // Armed: a round trip answered in time passes; then one that is not fails at
            // its deadline.
            deadline.arm(Duration::from_millis(500));
            b.write_all(b"y").await.unwrap();
            s.read_exact(&mut one).await.unwrap();
            deadline.arm(Duration::from_millis(100));
            let started = Instant::now();
            let e = s.read_exact(&mut one).await.unwrap_err();
            let took = started.elapsed();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
            assert!(e.to_string().contains("timed out"), "{e}");
            assert!(
                took >= Duration::from_millis(90) && took < Duration::from_secs(2),
                "{took:?}"
            );
            assert!(deadline.fired());
            deadline.disarm();
            b.write_all(b"z").await.unwrap();
            assert!(s.read_exact(&mut one).await.is_err(), "given up for good");
        });
    }

    /// The timer left set for an earlier round trip's deadline, gone off meanwhile, does not
    /// fail the next round trip: it is moved on to that one's deadline.
    #[test]
    fn an_earlier_deadline_does_not_cut_a_later_round_trip() {
        let rt = runtime();
        rt.block_on(async {
            let (a, mut b) = tokio::io::duplex(64);
            let deadline = Arc::new(Deadline::default());
            let mut s = Bounded::new(a, deadline.clone());
            let mut one = [0u8; 1];
            deadline.arm(Duration::from_millis(50));
            let waited = tokio::time::timeout(Duration::from_millis(10), s.read_exact(&mut one));
            assert!(waited.await.is_err(), "the timer is set");
            b.write_all(b"x").await.unwrap();
            s.read_exact(&mut one).await.unwrap();
            deadline.disarm();
            // The first deadline passes with nothing armed.
            tokio::time::sleep(Duration::from_millis(100)).await;
            deadline.arm(Duration::from_millis(300));
            let started = Instant::now();
            let e = s.read_exact(&mut one).await.unwrap_err();
            let took = started.elapsed();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
            assert!(
                took >= Duration::from_millis(290),
                "cut short after {took:?}"
            );
        });
    }

    /// A write that cannot go out (the peer reads nothing) fails at the deadline too.
    #[test]
    fn a_write_past_its_deadline_fails() {
        let rt = runtime();
        rt.block_on(async {
            let (a, _b) = tokio::io::duplex(16);
            let deadline = Arc::new(Deadline::default());
            let mut s = Bounded::new(a, deadline.clone());
            deadline.arm(Duration::from_millis(100));
            let e = s.write_all(&[0u8; 1024]).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        });
    }
}
