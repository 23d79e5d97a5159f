//! A link's byte stream, plain or TLS, split into a read and a write half.
//!
//! Plain links keep `TcpStream::into_split` (no lock between the halves);
//! only TLS links pay `tokio::io::split`'s shared state, which one rustls
//! session needs. The halves are enums, not boxed trait objects: a read on a
//! plain link costs one predictable branch more.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// One side of a TLS session over TCP.
pub type TlsTcp = tokio_rustls::TlsStream<TcpStream>;

/// A connected link.
pub enum LinkStream {
    Plain(TcpStream),
    Tls(Box<TlsTcp>),
}

impl LinkStream {
    /// The TCP connection under the link (addresses, capture taps).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            LinkStream::Plain(s) => s,
            LinkStream::Tls(s) => s.get_ref().0,
        }
    }

    /// Splits into halves the reader and the writer task own.
    pub fn into_split(self) -> (LinkRead, LinkWrite) {
        match self {
            LinkStream::Plain(s) => {
                let (r, w) = s.into_split();
                (LinkRead::Plain(r), LinkWrite::Plain(w))
            }
            LinkStream::Tls(s) => {
                let (r, w) = tokio::io::split(*s);
                (LinkRead::Tls(r), LinkWrite::Tls(w))
            }
        }
    }
}

pub enum LinkRead {
    Plain(OwnedReadHalf),
    Tls(ReadHalf<TlsTcp>),
}

pub enum LinkWrite {
    Plain(OwnedWriteHalf),
    Tls(WriteHalf<TlsTcp>),
}

impl AsyncRead for LinkRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkRead::Plain(r) => Pin::new(r).poll_read(cx, buf),
            LinkRead::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for LinkWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkWrite::Plain(w) => Pin::new(w).poll_write(cx, buf),
            LinkWrite::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkWrite::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            LinkWrite::Tls(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            LinkWrite::Plain(w) => w.is_write_vectored(),
            LinkWrite::Tls(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkWrite::Plain(w) => Pin::new(w).poll_flush(cx),
            LinkWrite::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkWrite::Plain(w) => Pin::new(w).poll_shutdown(cx),
            LinkWrite::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

/// The whole stream, for a user that does not split it (an HTTP client).
impl AsyncRead for LinkStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            LinkStream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for LinkStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            LinkStream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(s) => Pin::new(s).poll_flush(cx),
            LinkStream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            LinkStream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}
