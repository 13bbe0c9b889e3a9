//! Tar streams built in memory, including the hostile ones that `tar::Builder` refuses to
//! write (`..` names, absolute names): those headers get their name bytes written directly.

use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;
use tar::{EntryType, Header};

pub struct Tarball {
    out: tar::Builder<Vec<u8>>,
}

impl Default for Tarball {
    fn default() -> Self {
        Tarball {
            out: tar::Builder::new(Vec::new()),
        }
    }
}

impl Tarball {
    pub fn new() -> Tarball {
        Tarball::default()
    }

    /// An entry with exactly these name and link bytes (each at most 100), owned by root.
    pub fn raw(
        &mut self,
        kind: EntryType,
        name: &[u8],
        link: &[u8],
        mode: u32,
        data: &[u8],
    ) -> &mut Self {
        self.owned(kind, name, link, mode, (0, 0), data)
    }

    pub fn owned(
        &mut self,
        kind: EntryType,
        name: &[u8],
        link: &[u8],
        mode: u32,
        (uid, gid): (u64, u64),
        data: &[u8],
    ) -> &mut Self {
        assert!(
            name.len() <= 100 && link.len() <= 100,
            "use `long` for long names"
        );
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(uid);
        header.set_gid(gid);
        header.set_mtime(1_700_000_000);
        header.set_size(data.len() as u64);
        let old = header.as_old_mut();
        old.name[..name.len()].copy_from_slice(name);
        old.linkname[..link.len()].copy_from_slice(link);
        header.set_cksum();
        self.out.append(&header, data).unwrap();
        self
    }

    pub fn dir(&mut self, name: &str, mode: u32) -> &mut Self {
        self.raw(EntryType::Directory, name.as_bytes(), b"", mode, b"")
    }

    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> &mut Self {
        self.raw(EntryType::Regular, name.as_bytes(), b"", mode, data)
    }

    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(
            EntryType::Symlink,
            name.as_bytes(),
            target.as_bytes(),
            0o777,
            b"",
        )
    }

    pub fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(
            EntryType::Link,
            name.as_bytes(),
            target.as_bytes(),
            0o644,
            b"",
        )
    }

    /// An empty file named as a whiteout: `whiteout("a/b")` writes `a/.wh.b`.
    pub fn whiteout(&mut self, path: &str) -> &mut Self {
        let (dir, base) = path.rsplit_once('/').map_or(("", path), |(d, b)| (d, b));
        let name = if dir.is_empty() {
            format!(".wh.{base}")
        } else {
            format!("{dir}/.wh.{base}")
        };
        self.file(&name, 0o644, b"")
    }

    pub fn opaque(&mut self, dir: &str) -> &mut Self {
        self.file(&format!("{dir}/.wh..wh..opq"), 0o644, b"")
    }

    /// An entry whose name or link may exceed 100 bytes: the tar crate writes GNU long-name
    /// records for them.
    pub fn long(&mut self, kind: EntryType, name: &str, link: &str, data: &[u8]) -> &mut Self {
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_700_000_000);
        header.set_size(data.len() as u64);
        if link.is_empty() {
            self.out.append_data(&mut header, name, data).unwrap();
        } else {
            self.out.append_link(&mut header, name, link).unwrap();
        }
        self
    }

    /// A PAX extended header for the entry that follows.
    pub fn pax(&mut self, records: &[(&str, &str)]) -> &mut Self {
        let mut data = Vec::new();
        for (key, value) in records {
            let body = format!(" {key}={value}\n");
            // The length counts its own digits.
            let mut len = body.len() + 1;
            while format!("{len}{body}").len() != len {
                len += 1;
            }
            data.extend(format!("{len}{body}").into_bytes());
        }
        let mut header = Header::new_ustar();
        header.set_entry_type(EntryType::XHeader);
        header.set_size(data.len() as u64);
        header.as_old_mut().name[..9].copy_from_slice(b"PaxHeader");
        header.set_cksum();
        self.out.append(&header, &data[..]).unwrap();
        self
    }

    /// Raw bytes, appended as they are (for malformed streams).
    pub fn bytes_raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.out.get_mut().extend_from_slice(bytes);
        self
    }

    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(self.out.get_mut());
        out.extend([0u8; 1024]);
        out
    }
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}
