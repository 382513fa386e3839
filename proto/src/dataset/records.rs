//! Record files: a little-endian u32 length before each record. A worker reads a file once,
//! checks it against the record count and CRC-32C its dataset definition gives, and keeps it.

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;

use crate::coord::dispatcher::FileShard;

/// Record files a worker has read, checked against their count and checksum once.
#[derive(Default)]
pub struct FileCache {
    files: HashMap<String, (Bytes, Vec<(usize, usize)>)>,
}

impl FileCache {
    pub(super) fn record(
        &mut self,
        path: &str,
        crc: u32,
        count: u64,
        index: u64,
    ) -> Result<Bytes, String> {
        if !self.files.contains_key(path) {
            let loaded = load_record_file(Path::new(path), crc, count)?;
            self.files.insert(path.to_string(), loaded);
        }
        let (data, index_of) = &self.files[path];
        let (at, len) = index_of[index as usize];
        Ok(data.slice(at..at + len))
    }
}

fn load_record_file(
    path: &Path,
    crc: u32,
    count: u64,
) -> Result<(Bytes, Vec<(usize, usize)>), String> {
    let data = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let actual = crc32c(&data);
    if actual != crc {
        return Err(format!(
            "{}: CRC-32C is {actual:#010x}, the dataset definition says {crc:#010x}",
            path.display()
        ));
    }
    let mut index = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        let Some(head) = data.get(at..at + 4) else {
            return Err(format!(
                "{}: truncated record header at byte {at}",
                path.display()
            ));
        };
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if at + 4 + len > data.len() {
            return Err(format!(
                "{}: record at byte {at} runs past the end",
                path.display()
            ));
        }
        index.push((at + 4, len));
        at += 4 + len;
    }
    if index.len() as u64 != count {
        return Err(format!(
            "{}: holds {} records, the dataset definition says {count}",
            path.display(),
            index.len()
        ));
    }
    Ok((Bytes::from(data), index))
}

/// Writes `records` as a record file and returns its shard entry (count and checksum).
pub fn write_record_file(path: &Path, records: &[&[u8]]) -> std::io::Result<FileShard> {
    let mut data = Vec::new();
    for r in records {
        data.extend_from_slice(&(r.len() as u32).to_le_bytes());
        data.extend_from_slice(r);
    }
    std::fs::write(path, &data)?;
    Ok(FileShard {
        path: path.display().to_string(),
        num_records: records.len() as u64,
        crc32c: crc32c(&data),
    })
}

/// CRC-32C (Castagnoli), bitwise-reflected, as in iSCSI and TFRecord.
pub fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}
