//! From a verified token's claims to a `Principal`, with the claim names an identity provider uses.
use crate::ids::{SessionId, WorkspaceId};
use serde_json::{Map, Value};

use super::{Principal, Scope};
use crate::error::{Error, Result};

/// `sub`; the scopes from `scope_claim` (a space-separated string, as berth and OAuth 2 write it, or a
/// list, as some providers do: `scp`, `roles`); the workspaces from `workspaces_claim` (absent: all;
/// a list of workspace ids: only those, entries that are not ids dropped, which can only narrow it).
pub(super) fn principal(claims: Map<String, Value>, scope_claim: &str, workspaces_claim: &str) -> Result<Principal> {
    let refuse = |why: &str| {
        tracing::debug!(reason = why, "token rejected");
        Error::Unauthenticated("invalid or expired token")
    };
    let sub = claims
        .get("sub")
        .and_then(Value::as_str)
        .ok_or_else(|| refuse("sub is not a string"))?
        .to_string();
    let names: Vec<&str> = match claims.get(scope_claim) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => s.split_whitespace().collect(),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        Some(_) => return Err(refuse("the scope claim is neither a string nor a list")),
    };
    // Unknown scope names are ignored: a token minted for a newer berth still works for what we know.
    let scopes: Vec<Scope> = names.iter().filter_map(|s| s.parse().ok()).collect();
    let workspaces = match claims.get(workspaces_claim) {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .filter_map(Value::as_str)
                .filter_map(|s| s.parse::<WorkspaceId>().ok())
                .collect(),
        ),
        Some(_) => return Err(refuse("the workspaces claim is not a list")),
    };
    let session_id = match claims.get("session_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.parse::<SessionId>().map_err(|_| refuse("session_id is not an id"))?),
        Some(_) => return Err(refuse("session_id is not an id")),
    };
    let text = |claim: &str| {
        claims
            .get(claim)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|v| !v.is_empty() && v.len() <= 200)
            .map(str::to_string)
    };
    Ok(Principal {
        sub,
        scopes,
        workspaces,
        session_id,
        name: text("name"),
        email: text("email").filter(|e| e.contains('@')),
    })
}
