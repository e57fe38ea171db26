//! The generic `key=value,key=value` syntax of every command line option
//! group (`cloud-hypervisor --disk`, `ch-storage-daemon --image/--export`).
//!
//! A string enters [`KvList::parse`]; option parsers take the keys they know
//! with [`KvList::take`] and finish with [`KvList::finish`], which refuses
//! whatever is left, naming the key. A value may contain a comma only
//! inside square brackets (`queue_affinity=[0@[0,1],1@[2]]`), as in
//! Cloud Hypervisor. The image keys every binary shares are taken from a
//! list by `block::options::take_image_options`; each binary takes its
//! own keys from the same list.

use thiserror::Error;

/// A malformed `key=value` list; every variant names the option.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KvError {
    #[error("{option}: unknown key '{key}'")]
    UnknownKey { option: &'static str, key: String },
    #[error("{option}: key '{key}' given twice")]
    DuplicateKey { option: &'static str, key: String },
    #[error("{option}: key '{key}' needs a value ({key}=...)")]
    MissingValue { option: &'static str, key: String },
    #[error("{option}: missing required key '{key}'")]
    MissingKey {
        option: &'static str,
        key: &'static str,
    },
    #[error("{option}: bad value '{value}' for '{key}': {reason}")]
    BadValue {
        option: &'static str,
        key: String,
        value: String,
        reason: String,
    },
    /// Two keys that each parse but cannot be used together.
    #[error("{option}: '{first}' and '{second}' conflict: {reason}")]
    Conflict {
        option: &'static str,
        first: String,
        second: String,
        reason: String,
    },
    #[error("{option}: cannot parse '{value}': {reason}")]
    Syntax {
        option: &'static str,
        value: String,
        reason: String,
    },
}

/// The pairs of one option, in order, each taken at most once.
#[derive(Debug)]
pub struct KvList {
    option: &'static str,
    pairs: Vec<(String, Option<String>)>,
}

/// `s` split at the commas outside square brackets; `None` when the
/// brackets do not balance.
pub fn split_top_level(s: &str) -> Option<Vec<&str>> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    (depth == 0).then(|| {
        parts.push(&s[start..]);
        parts
    })
}

impl KvList {
    /// Splits `s` into pairs. A bare word without `=` is kept as a key with
    /// no value (some options accept a positional first word); duplicate
    /// keys are refused.
    pub fn parse(option: &'static str, s: &str) -> Result<KvList, KvError> {
        let mut pairs: Vec<(String, Option<String>)> = Vec::new();
        for part in split_top_level(s).ok_or_else(|| KvError::Syntax {
            option,
            value: s.to_string(),
            reason: "unbalanced square brackets".into(),
        })? {
            if part.is_empty() {
                return Err(KvError::Syntax {
                    option,
                    value: s.to_string(),
                    reason: "empty item between commas".into(),
                });
            }
            let (k, v) = match part.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (part.to_string(), None),
            };
            if k.is_empty() {
                return Err(KvError::Syntax {
                    option,
                    value: s.to_string(),
                    reason: "empty key".into(),
                });
            }
            if pairs.iter().any(|(pk, _)| *pk == k) {
                return Err(KvError::DuplicateKey { option, key: k });
            }
            pairs.push((k, v));
        }
        Ok(KvList { option, pairs })
    }

    pub fn option(&self) -> &'static str {
        self.option
    }

    /// Removes `key` and returns its value; a missing key is refused,
    /// naming it.
    pub fn take_required(&mut self, key: &'static str) -> Result<String, KvError> {
        self.take(key)?.ok_or(KvError::MissingKey {
            option: self.option,
            key,
        })
    }

    /// Removes `key` and returns its value (`Ok(None)` if absent). A key
    /// given without `=value` is refused.
    pub fn take(&mut self, key: &str) -> Result<Option<String>, KvError> {
        let Some(i) = self.pairs.iter().position(|(k, _)| k == key) else {
            return Ok(None);
        };
        match self.pairs.remove(i).1 {
            Some(v) => Ok(Some(v)),
            None => Err(KvError::MissingValue {
                option: self.option,
                key: key.to_string(),
            }),
        }
    }

    /// Removes a bare word (no `=`) if present, e.g. `tty` in `--serial tty`.
    pub fn take_word(&mut self, word: &str) -> bool {
        match self
            .pairs
            .iter()
            .position(|(k, v)| k == word && v.is_none())
        {
            Some(i) => {
                self.pairs.remove(i);
                true
            }
            None => false,
        }
    }

    /// Takes `key` and parses it with `parse`, turning its error into one
    /// that names the key and the value.
    pub fn take_parsed<T>(
        &mut self,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, KvError> {
        match self.take(key)? {
            None => Ok(None),
            Some(v) => parse(&v).map(Some).map_err(|reason| KvError::BadValue {
                option: self.option,
                key: key.to_string(),
                value: v,
                reason,
            }),
        }
    }

    /// Refuses any key nobody took.
    pub fn finish(self) -> Result<(), KvError> {
        match self.pairs.into_iter().next() {
            None => Ok(()),
            Some((key, _)) => Err(KvError::UnknownKey {
                option: self.option,
                key,
            }),
        }
    }
}

/// `on|off` (also `true|false`).
pub fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err("expected on or off".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commas_inside_brackets_stay_in_the_value() {
        let mut kv = KvList::parse("--disk", "path=x,queue_affinity=[0@[0,1],1@[2]],id=a").unwrap();
        assert_eq!(
            kv.take("queue_affinity").unwrap().as_deref(),
            Some("[0@[0,1],1@[2]]")
        );
        assert_eq!(kv.take("id").unwrap().as_deref(), Some("a"));
        for bad in ["path=x,a=[0", "path=x,a=]0[", "path=x,a=[[0]"] {
            assert!(
                matches!(KvList::parse("--disk", bad), Err(KvError::Syntax { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn takes_known_keys_and_refuses_the_rest() {
        let mut kv = KvList::parse("--disk", "path=/a,readonly=on,bogus=1").unwrap();
        assert_eq!(kv.take("path").unwrap().as_deref(), Some("/a"));
        assert_eq!(
            kv.take_parsed("readonly", parse_on_off).unwrap(),
            Some(true)
        );
        assert_eq!(kv.take("absent").unwrap(), None);
        let err = kv.finish().unwrap_err().to_string();
        assert!(err.contains("bogus"), "{err}");
    }

    #[test]
    fn refuses_duplicates_empty_items_and_bare_keys() {
        assert!(matches!(
            KvList::parse("--disk", "path=a,path=b"),
            Err(KvError::DuplicateKey { .. })
        ));
        assert!(KvList::parse("--disk", "path=a,,x=1").is_err());
        assert!(KvList::parse("--disk", "=1").is_err());
        let mut kv = KvList::parse("--disk", "path").unwrap();
        assert!(matches!(kv.take("path"), Err(KvError::MissingValue { .. })));
    }

    #[test]
    fn bad_value_names_key_and_value() {
        let mut kv = KvList::parse("--disk", "direct=maybe").unwrap();
        let err = kv
            .take_parsed("direct", parse_on_off)
            .unwrap_err()
            .to_string();
        assert!(err.contains("direct") && err.contains("maybe"), "{err}");
    }

    #[test]
    fn value_may_contain_equals() {
        let mut kv = KvList::parse("--serial", "file=/tmp/a=b").unwrap();
        assert_eq!(kv.take("file").unwrap().as_deref(), Some("/tmp/a=b"));
    }
}
