//! CRC-32 (IEEE 802.3, the zlib/PNG/gzip checksum) for verifying assembled UDF payloads
//! against [`UdfPayload::payload_crc32`](crate::wire::UdfPayload::payload_crc32) (spec §1.3).
//!
//! Reflected polynomial `0xEDB88320`, initial value and final XOR `0xFFFFFFFF`; one 256-entry
//! table built at compile time, one byte per step. Incremental: feed pieces to [`Crc32`] in
//! order and [`finish`](Crc32::finish) gives the checksum of their concatenation.

/// The reflected IEEE polynomial.
const POLY: u32 = 0xEDB8_8320;

/// `TABLE[b]` is the CRC register update for the byte `b` shifted out of the low end.
const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut r = i as u32;
        let mut bit = 0;
        while bit < 8 {
            r = if r & 1 == 1 { (r >> 1) ^ POLY } else { r >> 1 };
            bit += 1;
        }
        table[i] = r;
        i += 1;
    }
    table
};

/// An incremental CRC-32 (IEEE) computation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc32 {
    register: u32,
}

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32 {
    /// A computation over zero bytes so far.
    pub const fn new() -> Self {
        Crc32 {
            register: 0xFFFF_FFFF,
        }
    }

    /// Appends `bytes` to the checksummed data.
    pub fn update(&mut self, bytes: &[u8]) {
        let mut r = self.register;
        for &b in bytes {
            r = TABLE[((r ^ u32::from(b)) & 0xFF) as usize] ^ (r >> 8);
        }
        self.register = r;
    }

    /// The checksum of everything fed so far.
    pub const fn finish(&self) -> u32 {
        self.register ^ 0xFFFF_FFFF
    }
}

/// The CRC-32 (IEEE) of `bytes` in one call.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut c = Crc32::new();
    c.update(bytes);
    c.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_check_values() {
        // The standard check value of CRC-32/ISO-HDLC over "123456789".
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"a"), 0xE8B7_BE43);
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
    }

    #[test]
    fn incremental_equals_one_shot() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
        for split in [0, 1, 7, 500, 999, 1000] {
            let mut c = Crc32::new();
            c.update(&data[..split]);
            c.update(&data[split..]);
            assert_eq!(c.finish(), crc32(&data), "split at {split}");
        }
    }
}
