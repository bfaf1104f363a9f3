//! Keyset pagination over UUID v7 ids, newest first. The cursor is the last id served, so a page never
//! skips or repeats a row that existed when paging started, whatever is inserted meanwhile.
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use uuid::Uuid;

use crate::error::{Error, Result};

pub const DEFAULT_LIMIT: u64 = 50;
pub const MAX_LIMIT: u64 = 500;

#[derive(Debug, Clone, Copy)]
pub struct PageRequest {
    pub limit: u64,
    /// Serve only ids strictly below this one.
    pub before: Option<Uuid>,
}

impl PageRequest {
    pub fn parse(limit: Option<u64>, cursor: Option<&str>) -> Result<PageRequest> {
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(Error::BadRequest(format!("limit must be between 1 and {MAX_LIMIT}")));
        }
        let before = cursor.map(decode_cursor).transpose()?;
        Ok(PageRequest { limit, before })
    }

    /// Rows to fetch: one more than the page, to know whether another page follows.
    pub fn fetch(&self) -> u64 {
        self.limit + 1
    }
}

#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// Cuts `rows` (fetched with `req.fetch()`, ordered by id descending) into a page.
    pub fn from_rows<I: Into<Uuid>>(mut rows: Vec<T>, req: &PageRequest, id: impl Fn(&T) -> I) -> Page<T> {
        let more = rows.len() as u64 > req.limit;
        rows.truncate(req.limit as usize);
        let next_cursor = if more {
            rows.last().map(|r| encode_cursor(id(r).into()))
        } else {
            None
        };
        Page {
            items: rows,
            next_cursor,
        }
    }

    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            items: self.items.into_iter().map(f).collect(),
            next_cursor: self.next_cursor,
        }
    }
}

fn encode_cursor(id: Uuid) -> String {
    URL_SAFE_NO_PAD.encode(format!("v1:{id}"))
}

fn decode_cursor(cursor: &str) -> Result<Uuid> {
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| Error::InvalidCursor)?;
    let text = String::from_utf8(bytes).map_err(|_| Error::InvalidCursor)?;
    let id = text.strip_prefix("v1:").ok_or(Error::InvalidCursor)?;
    Uuid::parse_str(id).map_err(|_| Error::InvalidCursor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_rejects_garbage() {
        let id = Uuid::now_v7();
        assert_eq!(decode_cursor(&encode_cursor(id)).unwrap(), id);
        assert!(matches!(decode_cursor("not-a-cursor"), Err(Error::InvalidCursor)));
        assert!(matches!(
            decode_cursor(&URL_SAFE_NO_PAD.encode("v2:x")),
            Err(Error::InvalidCursor)
        ));
    }

    #[test]
    fn limit_is_bounded() {
        assert!(PageRequest::parse(Some(0), None).is_err());
        assert!(PageRequest::parse(Some(501), None).is_err());
        assert_eq!(PageRequest::parse(None, None).unwrap().limit, 50);
    }
}
