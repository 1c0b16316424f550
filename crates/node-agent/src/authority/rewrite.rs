//! The client-to-server byte stream rewriter: HTTP/2 framing in, header
//! blocks decoded with `loona-hpack`, re-encoded as literals (no I/O; see
//! [`super::FixAuthority`]).

use bytes::{Buf, BytesMut};
use loona_hpack::decoder::DecoderError;

/// The HTTP/2 client connection preface.
pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub(crate) const FRAME_HEADER: usize = 9;
pub(crate) const TYPE_HEADERS: u8 = 0x1;
pub(crate) const TYPE_CONTINUATION: u8 = 0x9;
pub(crate) const FLAG_END_STREAM: u8 = 0x1;
pub(crate) const FLAG_END_HEADERS: u8 = 0x4;
pub(crate) const FLAG_PADDED: u8 = 0x8;
pub(crate) const FLAG_PRIORITY: u8 = 0x20;

/// SETTINGS_MAX_FRAME_SIZE of the plugin server (set explicitly on the
/// server builder in [`super::serve`], so frames written here always fit).
pub(crate) const SERVER_MAX_FRAME_SIZE: u32 = 16_384;
/// SETTINGS_HEADER_TABLE_SIZE of the plugin server (h2's default, never
/// changed): the largest dynamic table a client may use.
pub(crate) const SERVER_HEADER_TABLE_SIZE: usize = 4096;
/// Largest header block (encoded, all fragments) accepted; gRPC requests
/// carry a few hundred bytes.
pub(crate) const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// Largest decoded header list accepted.
pub(crate) const MAX_HEADER_LIST: usize = 64 * 1024;

/// The value sent instead of an `:authority` that is not a URI authority.
pub(crate) const REPLACEMENT: &[u8] = b"localhost";

/// The client broke HTTP/2 framing or HPACK; the connection is closed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RewriteError {
    /// Framing that breaks RFC 9113 (what is wrong, in words).
    #[error("http/2: {0}")]
    Protocol(&'static str),
    /// A header block over [`MAX_HEADER_BLOCK`] encoded bytes.
    #[error("http/2: header block of {got} bytes exceeds {max}")]
    BlockTooLarge {
        /// Encoded bytes received so far.
        got: usize,
        /// The limit.
        max: usize,
    },
    /// A decoded header list over [`MAX_HEADER_LIST`] bytes (RFC 7541
    /// §4.1 sizes: name + value + 32 per field).
    #[error("http/2: decoded header list exceeds {0} bytes")]
    ListTooLarge(usize),
    /// The block is not valid HPACK.
    #[error("http/2: hpack: {0}")]
    Hpack(DecoderError),
}

#[derive(Debug)]
enum State {
    /// Bytes of the preface matched so far.
    Preface(usize),
    /// At a frame boundary.
    Frames,
    /// Payload bytes of a frame still to forward unchanged.
    Forward(usize),
    /// Not HTTP/2 with prior knowledge: forward everything, h2 answers.
    Raw,
}

/// A header block being collected from HEADERS and CONTINUATION frames.
#[derive(Debug)]
struct Pending {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
}

/// A decoded header field: name, value.
pub(crate) type Field = (Vec<u8>, Vec<u8>);

/// The client-to-server byte stream rewriter.
pub(crate) struct Rewriter {
    state: State,
    /// The client's HPACK context (its dynamic table), for the life of the
    /// connection.
    decoder: loona_hpack::Decoder<'static>,
    pending: Option<Pending>,
    /// How many `:authority` values were replaced.
    pub(crate) replaced: u64,
}

impl std::fmt::Debug for Rewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // loona's decoder has no Debug; its table is the client's business.
        f.debug_struct("Rewriter")
            .field("state", &self.state)
            .field("pending", &self.pending)
            .field("replaced", &self.replaced)
            .finish_non_exhaustive()
    }
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

/// True when h2 accepts `v` as `:authority`.
pub(crate) fn is_valid_authority(v: &[u8]) -> bool {
    http::uri::Authority::try_from(v).is_ok()
}

impl Rewriter {
    /// A rewriter at the start of a connection (before the preface).
    pub(crate) fn new() -> Rewriter {
        let mut decoder = loona_hpack::Decoder::new();
        // A size update above what the server advertised is an error.
        decoder.set_max_allowed_table_size(SERVER_HEADER_TABLE_SIZE);
        Rewriter {
            state: State::Preface(0),
            decoder,
            pending: None,
            replaced: 0,
        }
    }

    /// Consumes what it can of `input` (leaving an incomplete frame there)
    /// and appends the bytes for the server to `out`.
    pub(crate) fn feed(
        &mut self,
        input: &mut BytesMut,
        out: &mut BytesMut,
    ) -> Result<(), RewriteError> {
        loop {
            match self.state {
                State::Raw => {
                    out.extend_from_slice(&input.split());
                    return Ok(());
                }
                State::Preface(n) => {
                    let k = input.len().min(PREFACE.len() - n);
                    if input[..k] != PREFACE[n..n + k] {
                        self.state = State::Raw;
                        continue;
                    }
                    out.extend_from_slice(&input.split_to(k));
                    if n + k == PREFACE.len() {
                        self.state = State::Frames;
                    } else {
                        self.state = State::Preface(n + k);
                        return Ok(());
                    }
                }
                State::Forward(left) => {
                    let k = left.min(input.len());
                    out.extend_from_slice(&input.split_to(k));
                    if k == left {
                        self.state = State::Frames;
                    } else {
                        self.state = State::Forward(left - k);
                        return Ok(());
                    }
                }
                State::Frames => {
                    if input.len() < FRAME_HEADER {
                        return Ok(());
                    }
                    let len = (usize::from(input[0]) << 16)
                        | (usize::from(input[1]) << 8)
                        | usize::from(input[2]);
                    let ty = input[3];
                    let flags = input[4];
                    let stream =
                        u32::from_be_bytes([input[5], input[6], input[7], input[8]]) & 0x7fff_ffff;
                    if let Some(p) = &self.pending
                        && (ty != TYPE_CONTINUATION || stream != p.stream)
                    {
                        return Err(RewriteError::Protocol(
                            "a header block was interrupted by another frame",
                        ));
                    }
                    if ty != TYPE_HEADERS && ty != TYPE_CONTINUATION {
                        out.extend_from_slice(&input.split_to(FRAME_HEADER));
                        self.state = if len == 0 {
                            State::Frames
                        } else {
                            State::Forward(len)
                        };
                        continue;
                    }
                    if len > MAX_HEADER_BLOCK {
                        return Err(RewriteError::BlockTooLarge {
                            got: len,
                            max: MAX_HEADER_BLOCK,
                        });
                    }
                    if input.len() < FRAME_HEADER + len {
                        input.reserve(FRAME_HEADER + len - input.len());
                        return Ok(());
                    }
                    input.advance(FRAME_HEADER);
                    let payload = input.split_to(len);
                    self.header_frame(ty, flags, stream, &payload, out)?;
                }
            }
        }
    }

    fn header_frame(
        &mut self,
        ty: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), RewriteError> {
        if ty == TYPE_HEADERS {
            let mut body = payload;
            let mut pad = 0usize;
            if flags & FLAG_PADDED != 0 {
                let (&p, rest) = body.split_first().ok_or(RewriteError::Protocol(
                    "padded HEADERS without a pad length",
                ))?;
                pad = usize::from(p);
                body = rest;
            }
            let mut priority = None;
            if flags & FLAG_PRIORITY != 0 {
                if body.len() < 5 {
                    return Err(RewriteError::Protocol("HEADERS too short for its priority"));
                }
                let mut p = [0u8; 5];
                p.copy_from_slice(&body[..5]);
                priority = Some(p);
                body = &body[5..];
            }
            if pad > body.len() {
                return Err(RewriteError::Protocol("HEADERS padding exceeds the frame"));
            }
            let fragment = &body[..body.len() - pad];
            self.pending = Some(Pending {
                stream,
                flags,
                priority,
                block: fragment.to_vec(),
            });
        } else {
            let p = self
                .pending
                .as_mut()
                .ok_or(RewriteError::Protocol("CONTINUATION without HEADERS"))?;
            let got = p.block.len() + payload.len();
            if got > MAX_HEADER_BLOCK {
                return Err(RewriteError::BlockTooLarge {
                    got,
                    max: MAX_HEADER_BLOCK,
                });
            }
            p.block.extend_from_slice(payload);
        }
        if flags & FLAG_END_HEADERS == 0 {
            return Ok(());
        }
        let Some(p) = self.pending.take() else {
            return Err(RewriteError::Protocol("END_HEADERS without a header block"));
        };
        let mut fields = self.decode(&p.block)?;
        for (name, value) in &mut fields {
            if name == b":authority" && !is_valid_authority(value) {
                tracing::debug!(
                    authority = %String::from_utf8_lossy(&value[..value.len().min(128)]),
                    "replacing an :authority that is not a URI authority with localhost"
                );
                *value = REPLACEMENT.to_vec();
                self.replaced += 1;
            }
        }
        let block = encode_literal(&fields);
        write_header_frames(out, p.stream, p.flags & FLAG_END_STREAM, p.priority, &block);
        Ok(())
    }
}

impl Rewriter {
    /// Decodes one complete header block in the client's HPACK context,
    /// refusing a list over [`MAX_HEADER_LIST`] without copying past it.
    fn decode(&mut self, block: &[u8]) -> Result<Vec<Field>, RewriteError> {
        let mut fields = Vec::new();
        let mut size = 0usize;
        let mut over = false;
        self.decoder
            .decode_with_cb(block, |name, value| {
                size = size.saturating_add(name.len() + value.len() + 32);
                over |= size > MAX_HEADER_LIST;
                if !over {
                    fields.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(RewriteError::Hpack)?;
        if over {
            return Err(RewriteError::ListTooLarge(MAX_HEADER_LIST));
        }
        Ok(fields)
    }
}

/// Encodes fields as literals without indexing with literal names and no
/// Huffman (RFC 7541 §6.2.2, first form), so the server's decoder never
/// sees a dynamic table entry. (A field the client sent "never indexed" is
/// re-encoded like any other: the decoder does not report the
/// representation, and nothing past the server reads that flag.)
pub(crate) fn encode_literal(fields: &[Field]) -> Vec<u8> {
    use loona_hpack::encoder::encode_integer;
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        for s in [name, value] {
            // 7-bit length prefix; the high bit (Huffman) stays 0.
            out.extend_from_slice(&encode_integer(s.len(), 7));
            out.extend_from_slice(s);
        }
    }
    out
}

pub(crate) fn frame_header(out: &mut BytesMut, len: usize, ty: u8, flags: u8, stream: u32) {
    // `len` ≤ SERVER_MAX_FRAME_SIZE, so it fits in 24 bits.
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, ty, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// HEADERS then CONTINUATION frames carrying `block`, each within the
/// server's frame size.
fn write_header_frames(
    out: &mut BytesMut,
    stream: u32,
    end_stream: u8,
    priority: Option<[u8; 5]>,
    block: &[u8],
) {
    let max = SERVER_MAX_FRAME_SIZE as usize;
    let prio_len = if priority.is_some() { 5 } else { 0 };
    let first = block.len().min(max - prio_len);
    let mut flags = end_stream;
    if priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if first == block.len() {
        flags |= FLAG_END_HEADERS;
    }
    frame_header(out, first + prio_len, TYPE_HEADERS, flags, stream);
    if let Some(p) = priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(&block[..first]);
    let mut rest = &block[first..];
    while !rest.is_empty() {
        let k = rest.len().min(max);
        let flags = if k == rest.len() { FLAG_END_HEADERS } else { 0 };
        frame_header(out, k, TYPE_CONTINUATION, flags, stream);
        out.extend_from_slice(&rest[..k]);
        rest = &rest[k..];
    }
}
