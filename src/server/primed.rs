//! A connection's first bytes, read by the accept loop once the client has sent something, and
//! handed to the next reader (the TLS acceptor or hyper) before anything read from the socket:
//! one `recv` instead of a `peek` and a `recv` for the same bytes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// The most the first read takes: a device's upgrade request, its token included, fits in one;
/// the rest of a longer head is read by hyper as before.
pub const FIRST_READ: usize = 4096;

/// Waits until `stream` has bytes and reads at most [`FIRST_READ`] of them (empty: closed before
/// a byte). The buffer is made only for the read itself, so a silent socket holds none while it
/// waits (tokio takes a fresh socket for readable: the first try finds nothing and drops it).
pub async fn first_bytes(stream: &mut TcpStream) -> io::Result<Bytes> {
    loop {
        stream.readable().await?;
        let mut buf = BytesMut::with_capacity(FIRST_READ);
        match stream.try_read_buf(&mut buf) {
            Ok(n) => {
                if n < FIRST_READ {
                    // Drained, as tokio's own reads mark a socket after a short read: the next
                    // reader's first poll waits for readiness instead of trying the socket again.
                    let _ = stream.try_io(Interest::READABLE, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
                }
                return Ok(buf.freeze());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `inner` with `first` read ahead of it.
pub struct Primed<S> {
    first: Bytes,
    inner: S,
}

impl<S> Primed<S> {
    pub fn new(first: Bytes, inner: S) -> Primed<S> {
        Primed { first, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Primed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.first.is_empty() {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let n = self.first.len().min(buf.remaining());
        buf.put_slice(&self.first[..n]);
        self.first.advance(n);
        if self.first.is_empty() {
            // Frees the read's buffer now rather than with the connection.
            self.first = Bytes::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Primed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn the_first_bytes_are_read_once_and_come_back_ahead_of_the_rest() {
        let listener = crate::server::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        // Nothing sent yet: the read waits for it.
        let first = tokio::spawn(async move {
            let first = first_bytes(&mut server).await.unwrap();
            (first, server)
        });
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let (first, server) = first.await.unwrap();
        assert_eq!(&first[..], b"GET / HTTP/1.1\r\n");
        client.write_all(b"Host: x\r\n\r\n").await.unwrap();
        client.shutdown().await.unwrap();
        let mut primed = Primed::new(first, server);
        let mut all = Vec::new();
        primed.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    }

    #[tokio::test]
    async fn a_socket_closed_before_a_byte_reads_empty() {
        let listener = crate::server::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        drop(client);
        assert!(first_bytes(&mut server).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_reader_with_little_room_gets_the_first_bytes_in_turns() {
        let (a, mut b) = tokio::io::duplex(64);
        b.write_all(b"cd").await.unwrap();
        drop(b);
        let mut primed = Primed::new(Bytes::from_static(b"ab"), a);
        let mut one = [0u8; 1];
        let mut got = Vec::new();
        while primed.read(&mut one).await.unwrap() == 1 {
            got.push(one[0]);
        }
        assert_eq!(got, b"abcd");
    }
}
