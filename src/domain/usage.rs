//! What agents spend: every usage report an agent makes is checked and recorded per session turn, and
//! summed for a session, a task and a workspace. A record names its workspace, task and session without
//! depending on them: deleting a session or a task deletes its conversation, not the money it spent.
use crate::ids::{SessionId, TaskId, UsageRecordId, WorkspaceId};
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sea_orm::DatabaseTransaction;
use serde_json::Value;

use super::Ctx;
use crate::agent::UsageReport;
use crate::entity::{task, task_session, usage_record};
use crate::error::{Error, Result};
use crate::store::usage::{self as store, GroupBy, Key, Sums};

/// More tokens than any model call takes (a million-token context a hundred times over).
const MAX_TOKENS: i64 = 100_000_000;
/// More than one call costs, in any currency's unit.
const MAX_COST: f64 = 100_000.0;
/// Billionths: exact for every cost an agent reports (they are decimal fractions of a cent).
const NANOS: f64 = 1e9;

/// A session's, task's or group's sums.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Usage reports counted.
    pub reports: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// Per currency (`USD`, ...), billionths of its unit.
    pub cost_nanos: BTreeMap<String, i64>,
}

impl Totals {
    fn add(&mut self, s: &Sums) {
        self.reports += s.records.max(0) as u64;
        self.input_tokens += s.input_tokens.max(0) as u64;
        self.output_tokens += s.output_tokens.max(0) as u64;
        self.cache_read_tokens += s.cache_read_tokens.max(0) as u64;
        self.cache_write_tokens += s.cache_write_tokens.max(0) as u64;
        if let (Some(c), Some(n)) = (&s.currency, s.cost_nanos) {
            *self.cost_nanos.entry(c.clone()).or_default() += n;
        }
    }

    fn of(sums: &[Sums]) -> Totals {
        let mut t = Totals::default();
        for s in sums {
            t.add(s);
        }
        t
    }
}

/// A count the agent reported: absent or null is 0; anything but a whole number from 0 to
/// [`MAX_TOKENS`] is refused.
fn tokens(v: &Value, what: &str) -> std::result::Result<i64, String> {
    match v {
        Value::Null => Ok(0),
        Value::Number(n) => match n.as_i64() {
            Some(n) if (0..=MAX_TOKENS).contains(&n) => Ok(n),
            _ => Err(format!("{what} {n} is not a whole number from 0 to {MAX_TOKENS}")),
        },
        other => Err(format!("{what} {other} is not a number")),
    }
}

/// A cost the agent reported, in billionths: absent is none; negative, not finite, or above
/// `limit` is refused.
fn cost(v: &Value, limit: f64) -> std::result::Result<Option<i64>, String> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => match n.as_f64() {
            Some(x) if x.is_finite() && (0.0..=limit).contains(&x) => Ok(Some((x * NANOS).round() as i64)),
            _ => Err(format!("cost {n} is not from 0 to {limit}")),
        },
        other => Err(format!("cost {other} is not a number")),
    }
}

/// The model a session's agent names in what berth learned of it (Pi's `model`, an ACP model option).
fn learned_model(agent_state: Option<&Value>) -> Option<String> {
    let a = agent_state?;
    if let Some(m) = a["model"].as_str().or(a["model"]["id"].as_str()) {
        return Some(m.to_string());
    }
    a["config_options"].as_array()?.iter().find_map(|o| {
        (o["category"] == "model" || o["id"] == "model")
            .then(|| o["currentValue"].as_str().map(str::to_string))
            .flatten()
    })
}

/// Records one report in the writing transaction; `None` when it was refused (and logged) or said
/// nothing (a running total that did not move).
pub async fn record(
    txn: &DatabaseTransaction,
    s: &task_session::Model,
    task: &task::Model,
    r: &UsageReport,
) -> Result<Option<usage_record::Model>> {
    let checked = (|| {
        let counts = [
            tokens(&r.input, "input")?,
            tokens(&r.output, "output")?,
            tokens(&r.cache_read, "cache read")?,
            tokens(&r.cache_write, "cache write")?,
        ];
        let limit = if r.cumulative { MAX_COST * 1000.0 } else { MAX_COST };
        let amount = cost(&r.cost, limit)?;
        let currency = match (&amount, &r.currency) {
            (None, _) => None,
            (Some(_), Some(c)) if (1..=16).contains(&c.len()) && c.chars().all(|ch| ch.is_ascii_alphanumeric()) => {
                Some(c.to_ascii_uppercase())
            }
            (Some(_), _) => return Err("a cost without a currency code".to_string()),
        };
        Ok((counts, amount, currency))
    })();
    let (counts, amount, currency) = match checked {
        Ok(c) => c,
        Err(why) => {
            tracing::warn!(session = %s.id, report = ?r, "refused an agent's usage report: {why}");
            return Ok(None);
        }
    };
    // A running total is recorded as its step since the last one; a total that went down started
    // again (the agent restarted), so all of it is new.
    let (cost_nanos, cumulative) = match (amount, &currency, r.cumulative) {
        (Some(total), Some(c), true) => {
            let last = store::last_cumulative(txn, s.id, c).await?;
            let step = match last {
                Some(l) if total >= l => total - l,
                _ => total,
            };
            (Some(step), Some(total))
        }
        (amount, _, _) => (amount, None),
    };
    if counts.iter().all(|n| *n == 0) && cost_nanos.unwrap_or(0) == 0 {
        return Ok(None);
    }
    let now = crate::clock::now();
    let model = r
        .model
        .clone()
        .or_else(|| learned_model(s.agent_state.as_ref()))
        .filter(|m| !m.trim().is_empty())
        .map(|m| m.chars().take(200).collect())
        .unwrap_or_else(|| "unknown".to_string());
    let record = usage_record::Model {
        id: UsageRecordId::now_v7(),
        workspace_id: task.workspace_id,
        task_id: task.id,
        session_id: s.id,
        turn: crate::store::turns::newest_number(txn, s.id).await?,
        agent_profile: s.agent_profile.clone().unwrap_or_else(|| "default".into()),
        model,
        input_tokens: counts[0],
        output_tokens: counts[1],
        cache_read_tokens: counts[2],
        cache_write_tokens: counts[3],
        cost_nanos,
        currency: cost_nanos.and(currency),
        cumulative_cost_nanos: cumulative,
        day: now.format("%Y-%m-%d").to_string(),
        created_at: now,
    };
    store::insert(txn, record.clone()).await?;
    Ok(Some(record))
}

/// Counts a committed record in the process's metrics.
pub fn counted(ctx: &Ctx, r: &usage_record::Model) {
    let tokens = [
        ("input", r.input_tokens.max(0) as u64),
        ("output", r.output_tokens.max(0) as u64),
        ("cache_read", r.cache_read_tokens.max(0) as u64),
        ("cache_write", r.cache_write_tokens.max(0) as u64),
    ];
    let cost = match (&r.currency, r.cost_nanos) {
        (Some(c), Some(n)) => Some((c.as_str(), n as f64 / NANOS)),
        _ => None,
    };
    ctx.metrics.usage_recorded(&r.model, &r.agent_profile, tokens, cost);
}

pub async fn of_session(ctx: &Ctx, session_id: SessionId) -> Result<Totals> {
    Ok(Totals::of(&store::of_session(&ctx.db.conn, session_id).await?))
}

/// Each task's totals (a task without records is absent).
pub async fn of_tasks<C: sea_orm::ConnectionTrait>(conn: &C, task_ids: &[TaskId]) -> Result<BTreeMap<TaskId, Totals>> {
    let mut all: BTreeMap<TaskId, Totals> = BTreeMap::new();
    for (task, sums) in store::of_tasks(conn, task_ids).await? {
        all.entry(task).or_default().add(&sums);
    }
    Ok(all)
}

/// A workspace's rollup: its total in `[from, to)` and each group's, largest cost first (then by key).
pub struct Rollup {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub total: Totals,
    pub groups: Vec<(Key, Totals)>,
}

/// The longest span one rollup covers.
const MAX_SPAN_DAYS: i64 = 366;

pub async fn rollup(
    ctx: &Ctx,
    workspace_id: WorkspaceId,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    group_by: GroupBy,
) -> Result<Rollup> {
    let to = to.unwrap_or_else(|| crate::clock::now() + chrono::Duration::seconds(1));
    let from = match from {
        Some(f) => f,
        None => to
            .checked_sub_signed(chrono::Duration::days(30))
            .ok_or_else(|| Error::invalid("to", "too early"))?,
    };
    if from >= to {
        return Err(Error::invalid("from", "must be before `to`"));
    }
    if to - from > chrono::Duration::days(MAX_SPAN_DAYS) {
        return Err(Error::invalid(
            "from",
            format!("the span is at most {MAX_SPAN_DAYS} days"),
        ));
    }
    let rows = store::rollup(&ctx.db.conn, workspace_id, from, to, group_by).await?;
    let mut groups: BTreeMap<Key, Totals> = BTreeMap::new();
    let mut total = Totals::default();
    for (key, sums) in rows {
        total.add(&sums);
        groups.entry(key).or_default().add(&sums);
    }
    let mut groups: Vec<(Key, Totals)> = groups.into_iter().collect();
    if group_by != GroupBy::Day {
        let spent = |t: &Totals| t.cost_nanos.values().sum::<i64>();
        groups.sort_by(|a, b| spent(&b.1).cmp(&spent(&a.1)).then(a.0.cmp(&b.0)));
    }
    Ok(Rollup {
        from,
        to,
        total,
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_and_costs_are_checked() {
        assert_eq!(tokens(&json!(null), "input"), Ok(0));
        assert_eq!(tokens(&json!(12), "input"), Ok(12));
        assert!(tokens(&json!(-1), "input").is_err());
        assert!(tokens(&json!(1.5), "input").is_err());
        assert!(tokens(&json!(MAX_TOKENS + 1), "input").is_err());
        assert!(tokens(&json!("7"), "input").is_err());
        assert_eq!(cost(&json!(0.000138), MAX_COST), Ok(Some(138_000)));
        assert_eq!(cost(&json!(null), MAX_COST), Ok(None));
        assert!(cost(&json!(-0.01), MAX_COST).is_err());
        assert!(cost(&json!(1e12), MAX_COST).is_err());
    }

    #[test]
    fn the_model_comes_from_what_was_learned_when_the_report_names_none() {
        assert_eq!(learned_model(Some(&json!({"model": {"id": "m1"}}))), Some("m1".into()));
        let acp = json!({"config_options": [{"id": "model", "category": "model", "currentValue": "sonnet"}]});
        assert_eq!(learned_model(Some(&acp)), Some("sonnet".into()));
        assert_eq!(learned_model(None), None);
    }
}
