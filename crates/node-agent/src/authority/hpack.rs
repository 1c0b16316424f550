//! A small HPACK (RFC 7541) decoder and a literal-only encoder.
//!
//! The decoder is complete (static and dynamic tables, Huffman strings, size
//! updates) and refuses malformed input with an error instead of panicking:
//! it reads bytes sent by any client. The encoder writes only literals
//! without indexing and without Huffman, so whoever decodes its output never
//! needs a dynamic table.

use std::collections::VecDeque;

/// A decoded header field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    /// Sent as "never indexed" (sensitive): re-encoded the same way.
    pub sensitive: bool,
}

/// Malformed or over-limit HPACK input.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HpackError {
    #[error("hpack: header block ends inside a {0}")]
    Truncated(&'static str),
    #[error("hpack: integer too large")]
    IntegerOverflow,
    #[error("hpack: index {0} is not in the header tables")]
    BadIndex(usize),
    #[error("hpack: dynamic table size update to {got} exceeds the limit {max}")]
    TableSize { got: usize, max: usize },
    #[error("hpack: invalid huffman string")]
    Huffman,
    #[error("hpack: decoded header list exceeds {0} bytes")]
    ListTooLarge(usize),
}

/// RFC 7541 Appendix A.
const STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// Code length of each symbol (0..=255, then EOS) of the HPACK Huffman code
/// (RFC 7541 Appendix B). The code is canonical, so the lengths define it.
const HUFFMAN_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];
const EOS: u16 = 256;
const MAX_CODE_LEN: usize = 30;

/// The canonical code as tables for decoding bit by bit.
struct Huffman {
    /// First code of each length.
    first: [u32; MAX_CODE_LEN + 1],
    /// Number of codes of each length.
    count: [u32; MAX_CODE_LEN + 1],
    /// Offset into `symbols` of the first code of each length.
    offset: [u32; MAX_CODE_LEN + 1],
    /// Symbols ordered by (length, symbol).
    symbols: [u16; 257],
}

impl Huffman {
    const fn build() -> Huffman {
        let mut count = [0u32; MAX_CODE_LEN + 1];
        let mut i = 0;
        while i < 257 {
            count[HUFFMAN_LENGTHS[i] as usize] += 1;
            i += 1;
        }
        let mut first = [0u32; MAX_CODE_LEN + 1];
        let mut offset = [0u32; MAX_CODE_LEN + 1];
        let mut code = 0u32;
        let mut off = 0u32;
        let mut len = 1;
        while len <= MAX_CODE_LEN {
            code = (code + count[len - 1]) << 1;
            first[len] = code;
            offset[len] = off;
            off += count[len];
            len += 1;
        }
        let mut symbols = [0u16; 257];
        let mut filled = [0u32; MAX_CODE_LEN + 1];
        let mut s = 0;
        while s < 257 {
            let l = HUFFMAN_LENGTHS[s] as usize;
            symbols[(offset[l] + filled[l]) as usize] = s as u16;
            filled[l] += 1;
            s += 1;
        }
        Huffman {
            first,
            count,
            offset,
            symbols,
        }
    }

    /// The code of `sym`, as (code, length).
    #[cfg(test)]
    fn code(&self, sym: u16) -> (u32, u8) {
        let l = HUFFMAN_LENGTHS[sym as usize];
        let base = self.offset[l as usize] as usize;
        let rank = self.symbols[base..]
            .iter()
            .position(|&s| s == sym)
            .unwrap_or(0);
        (self.first[l as usize] + rank as u32, l)
    }
}

static HUFFMAN: Huffman = Huffman::build();

/// Decodes a Huffman-coded string (RFC 7541 §5.2).
pub fn huffman_decode(src: &[u8]) -> Result<Vec<u8>, HpackError> {
    let h = &HUFFMAN;
    let mut out = Vec::with_capacity(src.len() * 8 / 5);
    let mut code = 0u32;
    let mut len = 0usize;
    for &byte in src {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            if len > MAX_CODE_LEN {
                return Err(HpackError::Huffman);
            }
            let idx = code.wrapping_sub(h.first[len]);
            if code >= h.first[len] && idx < h.count[len] {
                let sym = h.symbols[(h.offset[len] + idx) as usize];
                if sym == EOS {
                    return Err(HpackError::Huffman);
                }
                out.push(sym as u8);
                code = 0;
                len = 0;
            }
        }
    }
    // Padding: fewer than 8 bits, all ones (a prefix of EOS).
    if len >= 8 || code != (1u32 << len) - 1 {
        return Err(HpackError::Huffman);
    }
    Ok(out)
}

/// Encodes with the Huffman code (for tests of the decoder).
#[cfg(test)]
pub fn huffman_encode(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut acc = 0u64;
    let mut bits = 0u32;
    for &b in src {
        let (c, l) = HUFFMAN.code(u16::from(b));
        acc = (acc << l) | u64::from(c);
        bits += u32::from(l);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) | ((1 << pad) - 1)) as u8);
    }
    out
}

/// Reads an integer with an `n`-bit prefix (RFC 7541 §5.1).
fn read_int(buf: &[u8], pos: &mut usize, n: u8) -> Result<usize, HpackError> {
    let first = *buf.get(*pos).ok_or(HpackError::Truncated("integer"))?;
    *pos += 1;
    let max = (1usize << n) - 1;
    let mut v = usize::from(first) & max;
    if v < max {
        return Ok(v);
    }
    let mut shift = 0u32;
    loop {
        let b = *buf.get(*pos).ok_or(HpackError::Truncated("integer"))?;
        *pos += 1;
        // Header blocks are capped far below 2^28; refuse anything larger.
        if shift > 21 {
            return Err(HpackError::IntegerOverflow);
        }
        v += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
}

fn read_string(buf: &[u8], pos: &mut usize) -> Result<Vec<u8>, HpackError> {
    let huff = buf
        .get(*pos)
        .map(|b| b & 0x80 != 0)
        .ok_or(HpackError::Truncated("string"))?;
    let len = read_int(buf, pos, 7)?;
    let end = pos
        .checked_add(len)
        .filter(|&e| e <= buf.len())
        .ok_or(HpackError::Truncated("string"))?;
    let raw = &buf[*pos..end];
    *pos = end;
    if huff {
        huffman_decode(raw)
    } else {
        Ok(raw.to_vec())
    }
}

/// Writes an integer with an `n`-bit prefix whose high bits are `flags`.
pub fn write_int(out: &mut Vec<u8>, flags: u8, n: u8, v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = v - max;
    while rest >= 0x80 {
        out.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

fn write_string(out: &mut Vec<u8>, s: &[u8]) {
    write_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// HPACK decoder state of one connection direction.
#[derive(Debug)]
pub struct Decoder {
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    /// Current maximum, set by size updates.
    max_size: usize,
    /// Upper bound for size updates (the receiver's SETTINGS_HEADER_TABLE_SIZE).
    limit: usize,
    /// Upper bound of one decoded header list (names + values + 32 each).
    max_list: usize,
}

impl Decoder {
    /// `limit`: the SETTINGS_HEADER_TABLE_SIZE the receiver advertised
    /// (4096 unless changed); `max_list`: largest decoded header list.
    pub fn new(limit: usize, max_list: usize) -> Decoder {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: limit,
            limit,
            max_list,
        }
    }

    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        match index {
            0 => Err(HpackError::BadIndex(0)),
            1..=61 => {
                let (n, v) = STATIC_TABLE[index - 1];
                Ok((n.as_bytes(), v.as_bytes()))
            }
            _ => self
                .table
                .get(index - 62)
                .map(|(n, v)| (n.as_slice(), v.as_slice()))
                .ok_or(HpackError::BadIndex(index)),
        }
    }

    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => {
                    self.size = 0;
                    break;
                }
            }
        }
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let sz = name.len() + value.len() + 32;
        if sz > self.max_size {
            // An entry larger than the table empties it (RFC 7541 §4.4).
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - sz);
        self.size += sz;
        self.table.push_front((name, value));
    }

    /// Decodes one complete header block.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<Field>, HpackError> {
        let mut out = Vec::new();
        let mut list = 0usize;
        let mut pos = 0usize;
        while pos < block.len() {
            let b = block[pos];
            let field = if b & 0x80 != 0 {
                let i = read_int(block, &mut pos, 7)?;
                let (n, v) = self.entry(i)?;
                Field {
                    name: n.to_vec(),
                    value: v.to_vec(),
                    sensitive: false,
                }
            } else if b & 0xc0 == 0x40 {
                let i = read_int(block, &mut pos, 6)?;
                let name = if i == 0 {
                    read_string(block, &mut pos)?
                } else {
                    self.entry(i)?.0.to_vec()
                };
                let value = read_string(block, &mut pos)?;
                self.insert(name.clone(), value.clone());
                Field {
                    name,
                    value,
                    sensitive: false,
                }
            } else if b & 0xe0 == 0x20 {
                let got = read_int(block, &mut pos, 5)?;
                if got > self.limit {
                    return Err(HpackError::TableSize {
                        got,
                        max: self.limit,
                    });
                }
                self.max_size = got;
                self.evict_to(got);
                continue;
            } else {
                let sensitive = b & 0x10 != 0;
                let i = read_int(block, &mut pos, 4)?;
                let name = if i == 0 {
                    read_string(block, &mut pos)?
                } else {
                    self.entry(i)?.0.to_vec()
                };
                let value = read_string(block, &mut pos)?;
                Field {
                    name,
                    value,
                    sensitive,
                }
            };
            list += field.name.len() + field.value.len() + 32;
            if list > self.max_list {
                return Err(HpackError::ListTooLarge(self.max_list));
            }
            out.push(field);
        }
        Ok(out)
    }
}

/// Encodes fields as literals without indexing (or never indexed), names by
/// static index where one exists, no Huffman: the decoder's dynamic table
/// is never touched.
pub fn encode_literal(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fields {
        let flags = if f.sensitive { 0x10 } else { 0x00 };
        match STATIC_TABLE
            .iter()
            .position(|(n, _)| n.as_bytes() == f.name.as_slice())
        {
            Some(i) => write_int(&mut out, flags, 4, i + 1),
            None => {
                out.push(flags);
                write_string(&mut out, &f.name);
            }
        }
        write_string(&mut out, &f.value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn huffman_matches_rfc7541_examples() {
        // RFC 7541 C.4.1 and C.4.2.
        assert_eq!(
            huffman_decode(&hex("f1e3 c2e5 f23a 6ba0 ab90 f4ff")).unwrap(),
            b"www.example.com"
        );
        assert_eq!(huffman_decode(&hex("a8eb 1064 9cbf")).unwrap(), b"no-cache");
        assert_eq!(
            huffman_encode(b"www.example.com"),
            hex("f1e3 c2e5 f23a 6ba0 ab90 f4ff")
        );
        // EOS's code is thirty ones.
        assert_eq!(HUFFMAN.code(EOS), (0x3fff_ffff, 30));
        assert_eq!(HUFFMAN.code(u16::from(b'0')), (0, 5));
    }

    #[test]
    fn huffman_roundtrips_every_byte_and_rejects_bad_padding() {
        let all: Vec<u8> = (0..=255u8).collect();
        assert_eq!(huffman_decode(&huffman_encode(&all)).unwrap(), all);
        let path = b"/var/lib/kubelet/device-plugins/gpusched-nvidia.com-gpu.sock";
        assert_eq!(huffman_decode(&huffman_encode(path)).unwrap(), path);
        // Padding of zero bits, or a whole byte of padding, is refused.
        assert_eq!(huffman_decode(&[0x00]), Err(HpackError::Huffman));
        assert_eq!(huffman_decode(&[0xff, 0xff]), Err(HpackError::Huffman));
        // Four EOS bytes contain the EOS symbol itself.
        assert_eq!(
            huffman_decode(&[0xff, 0xff, 0xff, 0xff]),
            Err(HpackError::Huffman)
        );
    }

    #[test]
    fn decodes_rfc7541_request_sequence_with_dynamic_table() {
        // RFC 7541 C.3: three requests sharing one dynamic table.
        let mut d = Decoder::new(4096, 1 << 16);
        let r1 = d
            .decode(&hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"))
            .unwrap();
        assert_eq!(r1[3].name, b":authority");
        assert_eq!(r1[3].value, b"www.example.com");
        let r2 = d
            .decode(&hex("8286 84be 5808 6e6f 2d63 6163 6865"))
            .unwrap();
        assert_eq!(r2[3].value, b"www.example.com");
        assert_eq!(r2[4].name, b"cache-control");
        let r3 = d
            .decode(&hex(
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
            ))
            .unwrap();
        assert_eq!(r3[3].value, b"www.example.com");
        assert_eq!(r3[4].name, b"custom-key");
        assert_eq!(d.size, 164);
    }

    #[test]
    fn malformed_blocks_are_errors_not_panics() {
        let mut d = Decoder::new(4096, 1 << 16);
        for bad in [
            &[0x80][..],                                     // index 0
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f][..], // huge integer
            &[0xbe][..],                                     // empty dynamic table
            &[0x41, 0x05, b'a'][..],                         // string past the end
            &[0x3f, 0xe1, 0x7f][..],                         // size update over the limit
            &[0x41][..],                                     // truncated
        ] {
            assert!(d.decode(bad).is_err(), "{bad:?}");
        }
        let mut small = Decoder::new(4096, 40);
        assert!(matches!(
            small.decode(&hex("8286")),
            Err(HpackError::ListTooLarge(40))
        ));
    }

    #[test]
    fn literal_encoding_decodes_back_without_touching_the_table() {
        let fields = vec![
            Field {
                name: b":authority".to_vec(),
                value: b"localhost".to_vec(),
                sensitive: false,
            },
            Field {
                name: b"x-long".to_vec(),
                value: vec![b'v'; 300],
                sensitive: true,
            },
        ];
        let block = encode_literal(&fields);
        let mut d = Decoder::new(4096, 1 << 16);
        assert_eq!(d.decode(&block).unwrap(), fields);
        assert!(d.table.is_empty());
    }
}
