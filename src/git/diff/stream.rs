//! `git diff --raw -z --numstat -p` read as it streams: the listing (bounded by the number of files),
//! then each file's patch kept up to `keep` bytes as it arrives; the rest of a file's bytes are read
//! through and dropped. berth never holds more of a diff than the listing and `keep` per file.
use super::{FileChange, parse_listing};

/// Where the patches start: the listing's last NUL, an empty field, the first file's header.
const MARKER: &[u8] = b"\0\0diff --git ";
/// A file's patch starts with this line (a content line never does: it starts with ' ', '+', '-', '@'
/// or '\').
const HEADER: &[u8] = b"diff --git ";

pub(super) struct Reader {
    /// Bytes kept of each file's patch.
    keep: usize,
    /// The files (by position) whose patches are kept at all: the page an answer shows.
    window: std::ops::Range<usize>,
    /// The listing so far, until the patches start.
    listing: Vec<u8>,
    /// The listed files, once the patches started (each one's patch fills as it streams).
    files: Option<Vec<FileChange>>,
    /// The listing could not be read.
    error: Option<String>,
    /// Patches seen (the current one is the last).
    patches: usize,
    /// The start of the current line, while it may still be a header.
    head: Vec<u8>,
    at_line_start: bool,
}

impl Reader {
    pub(super) fn new(keep: usize, window: std::ops::Range<usize>) -> Reader {
        Reader {
            keep,
            window,
            listing: Vec::new(),
            files: None,
            error: None,
            patches: 0,
            head: Vec::new(),
            at_line_start: true,
        }
    }

    pub(super) fn feed(&mut self, bytes: &[u8]) {
        if self.files.is_some() {
            return self.feed_patches(bytes);
        }
        let from = self.listing.len().saturating_sub(MARKER.len() - 1);
        self.listing.extend_from_slice(bytes);
        if let Some(i) = self.listing[from..].windows(MARKER.len()).position(|w| w == MARKER) {
            let i = from + i;
            let rest = self.listing.split_off(i + 2);
            self.listing.truncate(i + 1);
            match parse_listing(&self.listing) {
                Ok(files) => self.files = Some(files),
                Err(e) => {
                    self.error = Some(e);
                    self.files = Some(Vec::new());
                }
            }
            self.listing = Vec::new();
            self.feed_patches(&rest);
        }
    }

    fn feed_patches(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            if self.at_line_start {
                let want = (HEADER.len() - self.head.len()).min(bytes.len() - i);
                let part = &bytes[i..i + want];
                if let Some(nl) = part.iter().position(|b| *b == b'\n') {
                    // A line shorter than a header.
                    self.head.extend_from_slice(&part[..=nl]);
                    i += nl + 1;
                    self.flush_head();
                    continue;
                }
                self.head.extend_from_slice(part);
                i += want;
                if self.head.len() == HEADER.len() {
                    if self.head == HEADER {
                        self.patches += 1;
                    }
                    self.flush_head();
                    self.at_line_start = false;
                }
            } else {
                match bytes[i..].iter().position(|b| *b == b'\n') {
                    Some(nl) => {
                        self.push(&bytes[i..=i + nl]);
                        i += nl + 1;
                        self.at_line_start = true;
                    }
                    None => {
                        self.push(&bytes[i..]);
                        i = bytes.len();
                    }
                }
            }
        }
    }

    fn flush_head(&mut self) {
        let head = std::mem::take(&mut self.head);
        self.push(&head);
    }

    /// Bytes of the current file's patch: kept up to `keep`, the rest dropped.
    fn push(&mut self, bytes: &[u8]) {
        let Some(n) = self.patches.checked_sub(1) else {
            return;
        };
        let keep = if self.window.contains(&n) { self.keep } else { 0 };
        let Some(f) = self.files.as_mut().and_then(|files| files.get_mut(n)) else {
            return;
        };
        let room = keep.saturating_sub(f.patch.len());
        f.patch.extend_from_slice(&bytes[..room.min(bytes.len())]);
    }

    /// The files, each with its patch (at most `keep` bytes).
    pub(super) fn finish(mut self) -> Result<Vec<FileChange>, String> {
        self.flush_head();
        if let Some(e) = self.error {
            return Err(e);
        }
        let Some(files) = self.files else {
            // No patch at all: the whole output is the listing.
            return parse_listing(&self.listing);
        };
        if self.patches != files.len() {
            return Err(format!("{} files listed, {} patches", files.len(), self.patches));
        }
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the chunks, the files and their patches are the ones a whole read gives, each patch
    /// kept to its first `keep` bytes.
    #[test]
    fn a_streamed_diff_reads_like_a_whole_one_cut_per_file() {
        let listing: &[u8] = b":100644 100644 aaa bbb M\0a.txt\0:000000 100644 000 ccc A\0b.txt\0\
1\t1\ta.txt\0\x32\t0\tb.txt\0\0";
        let first = b"diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-diff --git x\n+y\n".to_vec();
        let second = [
            b"diff --git a/b.txt b/b.txt\nnew file\n@@ -0,0 +1,2 @@\n+".to_vec(),
            vec![b'z'; 5000],
            b"\n+w".to_vec(),
        ]
        .concat();
        let out = [listing, &first, &second].concat();
        for chunk in [1, 2, 7, 13, 64, 4096, out.len()] {
            for keep in [10, 60, usize::MAX] {
                let mut r = Reader::new(keep, 0..usize::MAX);
                for c in out.chunks(chunk) {
                    r.feed(c);
                }
                let files = r.finish().unwrap();
                assert_eq!(files.len(), 2);
                assert_eq!(files[0].path, "a.txt");
                assert_eq!(
                    files[0].patch,
                    first[..keep.min(first.len())],
                    "chunk {chunk} keep {keep}"
                );
                assert_eq!(
                    files[1].patch,
                    second[..keep.min(second.len())],
                    "chunk {chunk} keep {keep}"
                );
                assert_eq!(files[1].additions, Some(2));
            }
        }
        // No change: nothing listed, nothing kept.
        assert!(Reader::new(10, 0..usize::MAX).finish().unwrap().is_empty());
        // Outside the window: listed and counted, no patch kept.
        let mut r = Reader::new(usize::MAX, 1..2);
        r.feed(&out);
        let files = r.finish().unwrap();
        assert!(files[0].patch.is_empty() && files[0].additions == Some(1));
        assert_eq!(files[1].patch, second);
        // A patch missing is an error, as before.
        let mut r = Reader::new(10, 0..usize::MAX);
        r.feed(&[listing, &first].concat());
        assert!(r.finish().is_err());
    }
}
