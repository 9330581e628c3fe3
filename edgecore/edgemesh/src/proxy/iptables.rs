//! Applying planned rules: `iptables-restore --noflush` with the plan on its standard input
//! (one atomic transaction per table), the jumps from the built-in chains ensured with
//! `iptables -C`/`-I`, stale chains of ours deleted, and everything removed again by
//! [`Iptables::cleanup`] (`edgecore reset`). Programs are run with arguments, never through a
//! shell; the only text they get is the plan, which holds no user-chosen names.

use super::rules::{Chains, Plan};
use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    #[error(
        "cannot run {program}: {source} (install iptables, and run edgecore as root for Services at the edge)"
    )]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{program} {args} failed: {stderr}")]
    Failed {
        program: String,
        args: String,
        stderr: String,
    },
}

/// The iptables programs and our chain prefix.
#[derive(Debug, Clone)]
pub struct Iptables {
    pub iptables: String,
    pub restore: String,
    pub save: String,
    pub prefix: String,
}

/// Seconds to wait for the xtables lock.
const WAIT: &str = "5";

impl Iptables {
    pub fn new(prefix: &str) -> Iptables {
        Iptables {
            iptables: "iptables".into(),
            restore: "iptables-restore".into(),
            save: "iptables-save".into(),
            prefix: prefix.into(),
        }
    }

    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, IptablesError> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|source| IptablesError::Spawn {
            program: program.into(),
            source,
        })?;
        if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
            // A write error shows up as the program's failure below.
            let _ = input.write_all(text.as_bytes());
        }
        let out = child
            .wait_with_output()
            .map_err(|source| IptablesError::Spawn {
                program: program.into(),
                source,
            })?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(IptablesError::Failed {
                program: program.into(),
                args: args.join(" "),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }

    /// The jumps from the built-in chains into ours: (table, built-in chain, rule).
    fn hooks(&self) -> Vec<(&'static str, &'static str, Vec<String>)> {
        let c = Chains::new(&self.prefix);
        let jump = |to: &str| vec!["-j".to_string(), to.to_string()];
        let new_only = |to: &str| {
            vec![
                "-m".to_string(),
                "conntrack".to_string(),
                "--ctstate".to_string(),
                "NEW".to_string(),
                "-j".to_string(),
                to.to_string(),
            ]
        };
        vec![
            ("nat", "PREROUTING", jump(&c.services)),
            ("nat", "OUTPUT", jump(&c.services)),
            ("nat", "POSTROUTING", jump(&c.postrouting)),
            ("filter", "INPUT", new_only(&c.services)),
            ("filter", "FORWARD", new_only(&c.services)),
            ("filter", "OUTPUT", new_only(&c.services)),
        ]
    }

    /// Creates our top chains and the jumps into them, once each (idempotent).
    pub fn ensure_hooks(&self) -> Result<(), IptablesError> {
        let c = Chains::new(&self.prefix);
        for (table, chain) in [
            ("nat", &c.services),
            ("nat", &c.postrouting),
            ("nat", &c.nodeports),
            ("nat", &c.mark_masq),
            ("filter", &c.services),
        ] {
            if self
                .run(
                    &self.iptables,
                    &["-w", WAIT, "-t", table, "-S", chain],
                    None,
                )
                .is_err()
            {
                self.run(
                    &self.iptables,
                    &["-w", WAIT, "-t", table, "-N", chain],
                    None,
                )?;
            }
        }
        for (table, builtin, rule) in self.hooks() {
            let mut check = vec!["-w", WAIT, "-t", table, "-C", builtin];
            check.extend(rule.iter().map(String::as_str));
            if self.run(&self.iptables, &check, None).is_ok() {
                continue;
            }
            let mut insert = vec!["-w", WAIT, "-t", table, "-I", builtin, "1"];
            insert.extend(rule.iter().map(String::as_str));
            self.run(&self.iptables, &insert, None)?;
        }
        Ok(())
    }

    /// Our chains now in `table`, from `iptables-save`.
    pub fn existing_chains(&self, table: &str) -> Result<BTreeSet<String>, IptablesError> {
        let text = self.run(&self.save, &["-t", table], None)?;
        let ours = format!("{}-", self.prefix);
        Ok(text
            .lines()
            .filter_map(|l| l.strip_prefix(':'))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| name.starts_with(&ours))
            .map(str::to_string)
            .collect())
    }

    /// Applies `plan`, deleting our chains it no longer has, in one transaction per table.
    /// `previous` is the plan applied last by this process (its chains are all of ours that
    /// exist); without it the kernel is asked (`iptables-save`).
    pub fn apply(&self, plan: &Plan, previous: Option<&Plan>) -> Result<(), IptablesError> {
        let (nat_now, filter_now) = match previous {
            Some(p) => (p.nat_chains.clone(), p.filter_chains.clone()),
            None => (
                self.existing_chains("nat")?,
                self.existing_chains("filter")?,
            ),
        };
        let stale_nat: Vec<String> = nat_now.difference(&plan.nat_chains).cloned().collect();
        let stale_filter: Vec<String> = filter_now
            .difference(&plan.filter_chains)
            .cloned()
            .collect();
        let text = with_deletions(&plan.text, &stale_nat, &stale_filter);
        self.run(&self.restore, &["-w", WAIT, "--noflush"], Some(&text))?;
        Ok(())
    }

    /// Removes the jumps and every chain of ours (`edgecore reset`, module stop).
    pub fn cleanup(&self) -> Result<(), IptablesError> {
        for (table, builtin, rule) in self.hooks() {
            let mut delete = vec!["-w", WAIT, "-t", table, "-D", builtin];
            delete.extend(rule.iter().map(String::as_str));
            // Delete every copy (a crashed run may have left more than one).
            for _ in 0..8 {
                if self.run(&self.iptables, &delete, None).is_err() {
                    break;
                }
            }
        }
        let nat: Vec<String> = self.existing_chains("nat")?.into_iter().collect();
        let filter: Vec<String> = self.existing_chains("filter")?.into_iter().collect();
        if nat.is_empty() && filter.is_empty() {
            return Ok(());
        }
        let text = with_deletions("*nat\nCOMMIT\n*filter\nCOMMIT\n", &nat, &filter);
        self.run(&self.restore, &["-w", WAIT, "--noflush"], Some(&text))?;
        Ok(())
    }
}

/// `text` with the stale chains declared (which flushes them) and deleted at the end of
/// their table's transaction.
fn with_deletions(text: &str, nat: &[String], filter: &[String]) -> String {
    let mut out = String::with_capacity(text.len() + 64 * (nat.len() + filter.len()));
    let mut table = "";
    for line in text.lines() {
        if line == "COMMIT" {
            let stale = match table {
                "nat" => nat,
                "filter" => filter,
                _ => &[],
            };
            for chain in stale {
                out.push_str(&format!(":{chain} - [0:0]\n"));
            }
            for chain in stale {
                out.push_str(&format!("-X {chain}\n"));
            }
        }
        if let Some(t) = line.strip_prefix('*') {
            table = match t {
                "nat" => "nat",
                "filter" => "filter",
                _ => "",
            };
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_chains_are_flushed_then_deleted_inside_their_table() {
        let text = "*nat\n:KE-SERVICES - [0:0]\nCOMMIT\n*filter\n:KE-SERVICES - [0:0]\nCOMMIT\n";
        let out = with_deletions(text, &["KE-SVC-OLD".into()], &[]);
        assert_eq!(
            out,
            "*nat\n:KE-SERVICES - [0:0]\n:KE-SVC-OLD - [0:0]\n-X KE-SVC-OLD\nCOMMIT\n*filter\n:KE-SERVICES - [0:0]\nCOMMIT\n"
        );
    }

    #[test]
    fn a_missing_program_is_a_clear_error() {
        let mut ipt = Iptables::new("KT");
        ipt.save = "/nonexistent/iptables-save".into();
        let e = ipt.existing_chains("nat").unwrap_err().to_string();
        assert!(e.contains("cannot run /nonexistent/iptables-save"), "{e}");
        assert!(e.contains("install iptables"), "{e}");
    }
}
