//! Small self-checking files, replaced atomically: the snapshot and the witness use them.
//!
//! A file is `magic (8 bytes) | format version (u32 LE) | CRC32 of body (u32 LE) | body length
//! (u64 LE) | body`. It is written to a temporary file, synced, renamed over the old one, and the
//! directory synced, so a crash leaves the old or the new file, never a torn one.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

const HEADER_LEN: usize = 8 + 4 + 4 + 8;

/// Wraps `body` in the header.
pub fn frame(magic: &[u8; 8], version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The format version a framed file says it has (`None`: too short to say).
pub fn version_of(bytes: &[u8]) -> Option<u32> {
    let v = bytes.get(8..12)?;
    Some(u32::from_le_bytes([v[0], v[1], v[2], v[3]]))
}

/// Checks the header and returns the body, or says what is wrong with it.
pub fn unframe<'a>(magic: &[u8; 8], version: u32, bytes: &'a [u8]) -> Result<&'a [u8], String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!("{} bytes is shorter than the header", bytes.len()));
    }
    let (header, body) = bytes.split_at(HEADER_LEN);
    if &header[..8] != magic {
        return Err(format!(
            "bad magic, not a {} file",
            String::from_utf8_lossy(magic)
        ));
    }
    let word = |at: usize| {
        u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    if word(8) != version {
        return Err(format!("format version {}, expected {version}", word(8)));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&header[16..24]);
    let len = u64::from_le_bytes(len);
    if len != body.len() as u64 {
        return Err(format!(
            "body is {} bytes, header says {len} (truncated?)",
            body.len()
        ));
    }
    if crc32fast::hash(body) != word(12) {
        return Err("checksum mismatch".into());
    }
    Ok(body)
}

/// Durably replaces `dir/name` with `bytes`.
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

/// The file's bytes, or `None` if it does not exist.
pub fn read_if_exists(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_detect_damage() {
        let f = frame(b"TESTFILE", 3, b"hello");
        assert_eq!(unframe(b"TESTFILE", 3, &f), Ok(&b"hello"[..]));
        assert!(unframe(b"OTHERONE", 3, &f).is_err());
        assert!(unframe(b"TESTFILE", 4, &f).is_err());
        assert!(unframe(b"TESTFILE", 3, &f[..f.len() - 1]).is_err());
        let mut bad = f.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(
            unframe(b"TESTFILE", 3, &bad),
            Err("checksum mismatch".into())
        );
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_atomically(dir.path(), "f", b"one").expect("write");
        write_atomically(dir.path(), "f", b"two").expect("write");
        assert_eq!(
            read_if_exists(&dir.path().join("f")).expect("read"),
            Some(b"two".to_vec())
        );
        assert!(!dir.path().join("f.tmp").exists());
        assert_eq!(
            read_if_exists(&dir.path().join("missing")).expect("read"),
            None
        );
    }
}
