//! A getopt-style command line parser with qemu-img's conventions.
//!
//! Arguments enter as the words after the verb; they leave as a list of
//! (option, value) pairs in command-line order plus the operands. Short
//! options that take a value accept `-fVAL` and `-f VAL`; long options
//! accept `--name=VAL` and `--name VAL`. Options may follow operands (GNU
//! getopt permutes them); `--` ends option parsing.

use crate::error::CliError;

/// Which options a verb accepts.
pub struct OptSpec {
    /// Short options taking a value (e.g. `"fob"` for -f, -o, -b).
    pub short_with_value: &'static str,
    /// Short flags without a value.
    pub short_flags: &'static str,
    /// Long options taking a value (without the leading `--`).
    pub long_with_value: &'static [&'static str],
    /// Long flags without a value.
    pub long_flags: &'static [&'static str],
}

/// The parsed command line of one verb.
#[derive(Debug, Default)]
pub struct Parsed {
    /// Options in command-line order: short ones as "f", long ones as "output".
    pub opts: Vec<(String, Option<String>)>,
    pub operands: Vec<String>,
}

impl Parsed {
    /// The last value given for `name` (qemu-img lets a later option win).
    pub fn value(&self, name: &str) -> Option<&str> {
        self.opts
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// Every value given for `name`, in order (`-o` may repeat).
    pub fn values(&self, name: &str) -> Vec<&str> {
        self.opts
            .iter()
            .filter(|(n, _)| n == name)
            .filter_map(|(_, v)| v.as_deref())
            .collect()
    }

    pub fn flag(&self, name: &str) -> bool {
        self.opts.iter().any(|(n, _)| n == name)
    }
}

/// Splits `args` according to `spec`.
pub fn parse(args: &[String], spec: &OptSpec) -> Result<Parsed, CliError> {
    let mut out = Parsed::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            out.operands.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            if spec.long_with_value.contains(&name) {
                let value = match inline {
                    Some(v) => v,
                    None => {
                        let v = args.get(i).cloned().ok_or_else(|| missing(arg))?;
                        i += 1;
                        v
                    }
                };
                out.opts.push((name.to_string(), Some(value)));
            } else if spec.long_flags.contains(&name) && inline.is_none() {
                out.opts.push((name.to_string(), None));
            } else {
                return Err(unrecognized(arg));
            }
            continue;
        }
        if arg.len() > 1 && arg.starts_with('-') {
            let chars: Vec<char> = arg[1..].chars().collect();
            let mut j = 0;
            while j < chars.len() {
                let c = chars[j];
                j += 1;
                if spec.short_with_value.contains(c) {
                    let rest: String = chars[j..].iter().collect();
                    let value = if !rest.is_empty() {
                        rest
                    } else {
                        let v = args
                            .get(i)
                            .cloned()
                            .ok_or_else(|| missing(&format!("-{c}")))?;
                        i += 1;
                        v
                    };
                    out.opts.push((c.to_string(), Some(value)));
                    break;
                } else if spec.short_flags.contains(c) {
                    out.opts.push((c.to_string(), None));
                } else {
                    return Err(unrecognized(&format!("-{c}")));
                }
            }
            continue;
        }
        out.operands.push(arg.clone());
    }
    Ok(out)
}

/// qemu-img's words for an option it does not know.
fn unrecognized(option: &str) -> CliError {
    CliError::Syntax(format!("unrecognized option '{option}'"))
}

fn missing(option: &str) -> CliError {
    CliError::Syntax(format!("missing argument for option '{option}'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: OptSpec = OptSpec {
        short_with_value: "fo",
        short_flags: "qu",
        long_with_value: &["output"],
        long_flags: &["shrink"],
    };

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn short_long_and_permuted_operands() {
        let p = parse(
            &words("img -fqcow2 -o a=1 -q --output=json 10M -o b=2 --shrink"),
            &SPEC,
        )
        .unwrap();
        assert_eq!(p.operands, vec!["img", "10M"]);
        assert_eq!(p.value("f"), Some("qcow2"));
        assert_eq!(p.values("o"), vec!["a=1", "b=2"]);
        assert_eq!(p.value("output"), Some("json"));
        assert!(p.flag("q") && p.flag("shrink") && !p.flag("u"));
    }

    #[test]
    fn errors_name_the_option() {
        assert!(matches!(parse(&words("-x"), &SPEC), Err(CliError::Syntax(m)) if m.contains('x')));
        assert!(matches!(parse(&words("-f"), &SPEC), Err(CliError::Syntax(m)) if m.contains('f')));
        assert!(parse(&words("--bogus"), &SPEC).is_err());
    }

    #[test]
    fn double_dash_ends_options() {
        let p = parse(&words("-- -f"), &SPEC).unwrap();
        assert_eq!(p.operands, vec!["-f"]);
    }
}
