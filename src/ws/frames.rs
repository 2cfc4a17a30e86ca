//! Reads a device's WebSocket frames (RFC 6455 §5.2) off the socket with no standing buffer: the
//! heap holds only the frame being read, and nothing once it is handed over, so an idle session
//! holds no read buffer at all. fastwebsockets' reader keeps 8 KiB per connection for its whole
//! life (more than the rest of an idle session), and a device's pings and pongs walk through all
//! of it, so every page of it ends up resident. Writing stays with fastwebsockets; the errors are
//! its own, so close reasons read the same.
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use fastwebsockets::{OpCode, WebSocketError};
use tokio::io::{AsyncRead, ReadBuf};

/// Most bytes one read takes from the socket: a device writing far ahead of what the node
/// processes is held to one frame plus this much (fastwebsockets' buffer doubled whenever a read
/// filled it: ~2.5 MiB per connection under a flood of 60 KB frames).
pub const READ_CHUNK: usize = 4096;

/// What a frame's first read reserves: a device's usual frame (a pong, an ack, a small `up`)
/// arrives whole in one read, and the buffer is freed with it.
const FIRST_READ: usize = 256;

/// One frame as the device sent it, unmasked.
#[derive(Debug, PartialEq, Eq)]
pub struct InFrame {
    pub fin: bool,
    pub opcode: OpCode,
    pub payload: Vec<u8>,
}

/// The read half of a device's connection.
pub struct FrameReader<R> {
    io: R,
    /// Bytes read and not yet handed over; no capacity between frames.
    pending: Vec<u8>,
    /// A frame's payload must be shorter than this.
    max_frame: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(io: R, max_frame: usize) -> FrameReader<R> {
        FrameReader { io, pending: Vec::new(), max_frame }
    }

    /// Heap bytes the reader holds now.
    #[cfg(test)]
    fn held_bytes(&self) -> usize {
        self.pending.capacity()
    }

    /// The next frame. After an error the stream may be mid-frame: read no further. Cancel-safe:
    /// what was read stays in the reader.
    pub async fn read_frame(&mut self) -> Result<InFrame, WebSocketError> {
        self.fill(2).await?;
        let (b0, b1) = (self.pending[0], self.pending[1]);
        if b0 & 0b0111_0000 != 0 {
            return Err(WebSocketError::ReservedBitsNotZero);
        }
        let fin = b0 & 0b1000_0000 != 0;
        let opcode = OpCode::try_from(b0 & 0b0000_1111)?;
        let masked = b1 & 0b1000_0000 != 0;
        let extra = match b1 & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let head = 2 + extra + if masked { 4 } else { 0 };
        self.fill(head).await?;
        let len = match extra {
            0 => u64::from(b1 & 0x7f),
            2 => u64::from(u16::from_be_bytes([self.pending[2], self.pending[3]])),
            _ => u64::from_be_bytes(self.pending[2..10].try_into().expect("eight bytes")),
        };
        let control = matches!(opcode, OpCode::Close | OpCode::Ping | OpCode::Pong);
        if control && !fin {
            return Err(WebSocketError::ControlFrameFragmented);
        }
        if opcode == OpCode::Ping && len > 125 {
            return Err(WebSocketError::PingFrameTooLarge);
        }
        if len >= self.max_frame as u64 {
            return Err(WebSocketError::FrameTooLarge);
        }
        let total = head + len as usize;
        self.fill(total).await?;
        let mask: Option<[u8; 4]> = masked.then(|| self.pending[head - 4..head].try_into().expect("four bytes"));
        let mut payload = if self.pending.len() == total {
            // The usual case: the frame is all that was read; hand the buffer over.
            let mut whole = std::mem::take(&mut self.pending);
            whole.drain(..head);
            whole
        } else {
            let payload = self.pending[head..total].to_vec();
            self.pending.drain(..total);
            payload
        };
        if let Some(mask) = mask {
            fastwebsockets::unmask(&mut payload, mask);
        }
        if self.pending.is_empty() {
            self.pending = Vec::new();
        } else {
            // Part of the next frame: keep only room for it, not the last frame's.
            self.pending.shrink_to(FIRST_READ);
        }
        Ok(InFrame { fin, opcode, payload })
    }

    /// Reads until at least `n` bytes are pending.
    async fn fill(&mut self, n: usize) -> Result<(), WebSocketError> {
        if self.pending.capacity() < n {
            self.pending.reserve_exact(n.max(FIRST_READ) - self.pending.len());
        }
        while self.pending.len() < n {
            if std::future::poll_fn(|cx| self.poll_more(cx)).await? == 0 {
                return Err(WebSocketError::UnexpectedEOF);
            }
        }
        Ok(())
    }

    /// One read into the reserved room (at most [`READ_CHUNK`], at least one byte); 0 at EOF.
    fn poll_more(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let old = self.pending.len();
        let room = (self.pending.capacity() - old).clamp(1, READ_CHUNK);
        self.pending.resize(old + room, 0);
        let mut buf = ReadBuf::new(&mut self.pending[old..]);
        let polled = Pin::new(&mut self.io).poll_read(cx, &mut buf);
        let got = buf.filled().len();
        self.pending.truncate(old + got);
        ready!(polled)?;
        Poll::Ready(Ok(got))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A client frame: masked with `mask`, the length in its shortest form.
    fn frame(fin: bool, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = vec![(u8::from(fin) << 7) | opcode];
        let m = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => out.push(m | n as u8),
            n if n <= 0xffff => {
                out.push(m | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(m | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mut body = payload.to_vec();
        if let Some(mask) = mask {
            out.extend_from_slice(&mask);
            fastwebsockets::unmask(&mut body, mask);
        }
        out.extend_from_slice(&body);
        out
    }

    /// Every frame in `bytes`, the error that ended them, and the bytes held after each frame.
    async fn read_all(bytes: Vec<u8>, max_frame: usize) -> (Vec<InFrame>, Option<WebSocketError>, Vec<usize>) {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let writer = tokio::spawn(async move {
            // Byte by byte for the first frame's head, then in bulk: frames split anywhere.
            let split = bytes.len().min(3);
            for b in &bytes[..split] {
                client.write_all(&[*b]).await.unwrap();
            }
            client.write_all(&bytes[split..]).await.unwrap();
        });
        let mut reader = FrameReader::new(server, max_frame);
        let (mut frames, mut held) = (Vec::new(), Vec::new());
        let err = loop {
            match reader.read_frame().await {
                Ok(f) => frames.push(f),
                Err(e) => break Some(e),
            }
            held.push(reader.held_bytes());
        };
        writer.await.unwrap();
        (frames, err, held)
    }

    #[tokio::test]
    async fn frames_of_every_length_form_masked_or_not_split_anywhere() {
        let big = vec![7u8; 70_000];
        let mid = vec![9u8; 300];
        let mut bytes = frame(true, 1, b"{\"t\":\"ping\"}", Some([1, 2, 3, 4]));
        bytes.extend(frame(false, 1, &mid, Some([9, 8, 7, 6])));
        bytes.extend(frame(true, 0, &big, Some([0xaa, 0x55, 0, 0xff])));
        bytes.extend(frame(true, 9, b"", None));
        let (frames, err, held) = read_all(bytes, 100_000).await;
        assert!(matches!(err, Some(WebSocketError::UnexpectedEOF)), "{err:?}");
        let got: Vec<_> = frames.iter().map(|f| (f.fin, f.opcode, f.payload.len())).collect();
        assert_eq!(
            got,
            vec![
                (true, OpCode::Text, 12),
                (false, OpCode::Text, 300),
                (true, OpCode::Continuation, 70_000),
                (true, OpCode::Ping, 0)
            ]
        );
        assert_eq!(frames[0].payload, b"{\"t\":\"ping\"}");
        assert_eq!(frames[1].payload, mid);
        assert_eq!(frames[2].payload, big);
        // Between frames the reader holds at most the start of the next one; nothing when idle.
        assert!(held.iter().all(|h| *h <= FIRST_READ), "{held:?}");
        assert_eq!(held.last(), Some(&0));
    }

    #[tokio::test]
    async fn bad_frames_are_refused_before_their_payload_is_read() {
        type Expected = fn(&WebSocketError) -> bool;
        let cases: Vec<(Vec<u8>, Expected)> = vec![
            (frame(true, 0x40 | 1, b"x", None), |e| matches!(e, WebSocketError::ReservedBitsNotZero)),
            (frame(true, 3, b"x", None), |e| matches!(e, WebSocketError::InvalidValue)),
            (frame(false, 9, b"x", None), |e| matches!(e, WebSocketError::ControlFrameFragmented)),
            (frame(true, 9, &[0; 126], None), |e| matches!(e, WebSocketError::PingFrameTooLarge)),
            (frame(true, 1, &[b'a'; 1000], None), |e| matches!(e, WebSocketError::FrameTooLarge)),
            // A length no payload follows: refused on the header alone, nothing reserved for it.
            (vec![0x81, 127, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], |e| {
                matches!(e, WebSocketError::FrameTooLarge)
            }),
        ];
        for (bytes, expected) in cases {
            let (frames, err, _) = read_all(bytes, 1000).await;
            assert!(frames.is_empty());
            let err = err.expect("an error");
            assert!(expected(&err), "{err:?}");
        }
    }

    #[tokio::test]
    async fn a_flood_is_read_one_frame_and_one_chunk_at_a_time() {
        let one = frame(true, 1, &[b'a'; 60_000], Some([1, 1, 1, 1]));
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let flood = one.repeat(10);
        client.write_all(&flood).await.unwrap();
        let mut reader = FrameReader::new(server, 64 * 1024);
        for _ in 0..10 {
            let f = reader.read_frame().await.unwrap();
            assert_eq!(f.payload.len(), 60_000);
            assert!(reader.held_bytes() <= READ_CHUNK.max(FIRST_READ), "held {}", reader.held_bytes());
        }
    }
}
