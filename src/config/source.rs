//! Where a setting's value comes from: a variable (or a flag), else the file, else its default.
use toml::Value;

use super::settings::{Fallback, find};
use super::{ConfigError, Env, bad};

/// Where values come from: a variable (or a flag, which `main` lays over the environment), else the file,
/// else the setting's default.
pub(super) struct Source<'a> {
    pub env: &'a dyn Env,
    pub file: toml::Table,
}

impl Source<'_> {
    /// The value given by the environment or the file, as text (an array joined by the separator).
    pub fn given(&self, key: &str) -> Result<Option<String>, ConfigError> {
        let s = find(key);
        if let Some(v) = self.env.get(&s.var()) {
            return Ok(Some(v));
        }
        let Some(value) = self.file.get(key) else {
            return Ok(None);
        };
        let scalar = |v: &Value| match v {
            Value::String(s) => Ok(s.clone()),
            Value::Integer(n) => Ok(n.to_string()),
            Value::Float(f) => Ok(f.to_string()),
            Value::Boolean(b) => Ok(b.to_string()),
            other => Err(bad(
                &s.var(),
                format!("the file's {key} is a {}, not a value", other.type_str()),
            )),
        };
        match (value, s.separator) {
            (Value::Array(items), Some(sep)) => Ok(Some(
                items
                    .iter()
                    .map(scalar)
                    .collect::<Result<Vec<_>, _>>()?
                    .join(&sep.to_string()),
            )),
            (v, _) => scalar(v).map(Some),
        }
    }

    /// The given value, else the default (`None` for a setting without a plain default).
    pub fn get(&self, key: &str) -> Result<Option<String>, ConfigError> {
        Ok(match self.given(key)? {
            Some(v) => Some(v),
            None => match find(key).default {
                Fallback::Value(v) => Some(v.to_string()),
                _ => None,
            },
        })
    }

    /// A number; an unparsable one is an error naming the variable.
    pub fn num<T: std::str::FromStr>(&self, key: &str) -> Result<T, ConfigError>
    where
        T::Err: std::fmt::Display,
    {
        let var = find(key).var();
        let v = self.get(key)?.ok_or_else(|| bad(&var, "has no default"))?;
        v.trim().parse::<T>().map_err(|e| bad(&var, format!("{v:?}: {e}")))
    }

    /// A number that must be at least 1.
    pub fn positive<T: std::str::FromStr + PartialOrd + From<u8>>(&self, key: &str) -> Result<T, ConfigError>
    where
        T::Err: std::fmt::Display,
    {
        let n: T = self.num(key)?;
        if n < T::from(1u8) {
            return Err(bad(&find(key).var(), "must be at least 1"));
        }
        Ok(n)
    }

    /// `true`/`1` or `false`/`0` (the default when unset).
    pub fn boolean(&self, key: &str) -> Result<bool, ConfigError> {
        match self.get(key)?.as_deref() {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") => Ok(true),
            Some(other) => Err(bad(&find(key).var(), format!("{other:?} is not true or false"))),
        }
    }
}
