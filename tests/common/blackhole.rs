//! A TCP proxy to a database server that can be switched to swallow everything: it goes on
//! accepting connections and keeps every one open, but passes no byte either way, as a server
//! (or a proxy in front of one) that stops answering does. Its own kernel still acknowledges
//! what the client sends and answers keepalive probes, so TCP notices nothing: only a
//! client-side deadline on the round trip does. Switched back, it passes bytes again, on the
//! connections it held (what they sent meanwhile is delivered then) and on new ones.
//!
//! ```ignore
//! let (hole, url) = BlackHole::before(Db::Postgres, &live.url);
//! let broker = Broker::connect(&url)?;
//! hole.swallow(); // .. the broker's calls give up within their bounds ..
//! hole.pass();    // .. and work again
//! ```

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::Db;

/// How long a pump's read waits before it looks at the switches again.
const TICK: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Switches {
    /// Pass nothing (connections are still accepted and held).
    swallow: AtomicBool,
    /// The proxy is dropped: every pump ends and closes its sockets.
    stop: AtomicBool,
    /// Connections accepted so far.
    accepted: AtomicUsize,
}

/// The proxy; stopped (every connection closed) when dropped.
pub struct BlackHole {
    /// `127.0.0.1:<port>` of the proxy.
    pub addr: String,
    switches: Arc<Switches>,
}

impl BlackHole {
    /// A proxy to `upstream` (`host:port`), passing bytes.
    pub fn start(upstream: &str) -> BlackHole {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener
            .local_addr()
            .expect("the proxy's address")
            .to_string();
        let switches = Arc::new(Switches::default());
        let (s, upstream) = (switches.clone(), upstream.to_string());
        std::thread::Builder::new()
            .name("test-blackhole".into())
            .spawn(move || accept(&listener, &upstream, &s))
            .expect("spawn the proxy");
        BlackHole { addr, switches }
    }

    /// A proxy to the server of `url` (a `db` server's URL), and the URL through it.
    pub fn before(db: Db, url: &str) -> (BlackHole, String) {
        let hole = BlackHole::start(&upstream(db, url));
        let through = via(url, &hole.addr);
        let through = match db {
            // The driver would otherwise move to the server's Unix socket, past the proxy.
            Db::Mysql => super::with_params(&through, "prefer_socket=false"),
            _ => through,
        };
        (hole, through)
    }

    /// From now on, nothing passes either way: the connections stay open, new ones are
    /// accepted, and their bytes wait in the kernels' buffers.
    pub fn swallow(&self) {
        self.switches.swallow.store(true, Ordering::SeqCst);
    }

    /// From now on, bytes pass again (those sent meanwhile first).
    pub fn pass(&self) {
        self.switches.swallow.store(false, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.switches.accepted.load(Ordering::SeqCst)
    }

    /// A guard that makes the proxy pass bytes again when it is dropped. Declared after the
    /// broker, it is dropped first should the test fail: a call still waiting on the proxy
    /// then ends, and the broker's own drop (which joins its threads) does not wait for ever.
    pub fn passes_on_drop(&self) -> PassOnDrop {
        PassOnDrop(self.switches.clone())
    }
}

/// See [`BlackHole::passes_on_drop`].
pub struct PassOnDrop(Arc<Switches>);

impl Drop for PassOnDrop {
    fn drop(&mut self) {
        self.0.swallow.store(false, Ordering::SeqCst);
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.switches.stop.store(true, Ordering::SeqCst);
    }
}

fn accept(listener: &TcpListener, upstream: &str, s: &Arc<Switches>) {
    while !s.stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(_) => {
                std::thread::sleep(TICK);
                continue;
            }
        };
        s.accepted.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_nonblocking(false);
        let Ok(server) = TcpStream::connect(upstream) else {
            continue; // the client sees its connection closed
        };
        for (from, to) in [
            (client.try_clone(), server.try_clone()),
            (server.try_clone(), client.try_clone()),
        ] {
            if let (Ok(from), Ok(to)) = (from, to) {
                let s = s.clone();
                let _ = std::thread::Builder::new()
                    .name("test-blackhole-pump".into())
                    .spawn(move || pump(from, to, &s));
            }
        }
    }
}

/// Copies `from` to `to` until either side ends or the proxy stops; reads nothing while it
/// swallows, and holds what a read already under way brought in (nothing is written after
/// `swallow()` returned) until it passes again.
fn pump(mut from: TcpStream, mut to: TcpStream, s: &Switches) {
    let _ = from.set_read_timeout(Some(TICK));
    let mut buf = vec![0u8; 64 * 1024];
    let swallowing = || s.swallow.load(Ordering::SeqCst) && !s.stop.load(Ordering::SeqCst);
    while !s.stop.load(Ordering::SeqCst) {
        if swallowing() {
            std::thread::sleep(TICK);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                while swallowing() {
                    std::thread::sleep(TICK);
                }
                if s.stop.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// `host:port` of the server of `url`.
fn upstream(db: Db, url: &str) -> String {
    let rest = url.split_once("://").expect("a url").1;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let host = rest.split(['/', '?']).next().unwrap_or_default();
    let default = if db == Db::Mysql { 3306 } else { 5432 };
    if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:{default}")
    }
}

/// `url` with its host and port replaced by `hostport`.
fn via(url: &str, hostport: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a url");
    let (user, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (format!("{u}@"), r),
        None => (String::new(), rest),
    };
    let path = rest.find(['/', '?']).map_or("", |i| &rest[i..]);
    format!("{scheme}://{user}{hostport}{path}")
}
