//! The target of a link: `--arch sm_XY[a|f]` as an SM number and a suffix,
//! and the rules nvlink follows for which SASS and PTX serve it (measured on
//! every target of the toolkit, sm_75 … sm_121, plain, `a` and `f`; see
//! docs/nvlink-behaviour.md, "Which member serves a target").

/// The target of the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// SM number (90 for sm_90).
    pub sm: u32,
    /// The suffix of `sm_90a` / `sm_100f` style targets.
    pub suffix: Option<char>,
}

/// An arch as nvcc spells it: `arch_name("compute", 100, Some('f'))` is `compute_100f`.
pub(crate) fn arch_name(kind: &str, sm: u32, suffix: Option<char>) -> String {
    match suffix {
        Some(c) => format!("{kind}_{sm}{c}"),
        None => format!("{kind}_{sm}"),
    }
}

impl Target {
    /// The target as `--arch` names it (`sm_100f`).
    pub fn name(&self) -> String {
        arch_name("sm", self.sm, self.suffix)
    }

    /// The arch PTX is compiled for at link time: a family target compiles
    /// for its plain arch (nvlink runs its ptxas with `-arch sm_100` for
    /// `--arch=sm_100f`).
    pub(crate) fn jit_arch(&self) -> String {
        match self.suffix {
            Some('f') => arch_name("sm", self.sm, None),
            _ => self.name(),
        }
    }

    /// Whether SASS built for `sm` with `suffix` is linked as is for this
    /// target (same SM number). Only the pairings compared against nvlink are
    /// listed; any other reuse is left to the real nvlink.
    pub(crate) fn takes_sass(&self, sm: u32, suffix: Option<char>) -> bool {
        match suffix {
            None => sm == self.sm,
            Some('a') => sm == self.sm && self.suffix == Some('a'),
            // Family SASS runs on every later arch of its family.
            Some('f') => sm / 10 == self.sm / 10 && sm <= self.sm,
            Some(_) => false,
        }
    }
}

impl Target {
    /// The device target of `--arch sm_*` (None for `compute_*`/`lto_*`).
    pub(crate) fn of_arch(arch: &str) -> Option<Target> {
        let rest = arch.strip_prefix("sm_")?;
        Some(Target { sm: arch_number(arch)?, suffix: rest.chars().last().filter(char::is_ascii_alphabetic) })
    }
}

/// `sm_90a` / `compute_90` / `lto_100f` → 90 / 90 / 100.
pub(crate) fn arch_number(arch: &str) -> Option<u32> {
    let digits = arch.split('_').nth(1)?;
    let n: String = digits.chars().take_while(|c| c.is_ascii_digit()).collect();
    n.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixed_targets_pick_their_sass_and_jit_arch() {
        let t = |sm, suffix| Target { sm, suffix };
        // Plain SASS serves its own SM number, suffixed or not.
        assert!(t(100, None).takes_sass(100, None));
        assert!(t(100, Some('a')).takes_sass(100, None));
        assert!(!t(103, None).takes_sass(100, None));
        // Arch-specific SASS only its exact arch-specific target.
        assert!(t(100, Some('a')).takes_sass(100, Some('a')));
        assert!(!t(100, None).takes_sass(100, Some('a')));
        assert!(!t(100, Some('f')).takes_sass(100, Some('a')));
        // Family SASS every later member of its family.
        assert!(t(103, None).takes_sass(100, Some('f')));
        assert!(!t(110, None).takes_sass(100, Some('f')));
        assert!(!t(100, None).takes_sass(103, Some('f')));
        assert_eq!(t(120, Some('f')).name(), "sm_120f");
        assert_eq!(t(120, Some('f')).jit_arch(), "sm_120");
        assert_eq!(t(90, Some('a')).jit_arch(), "sm_90a");
    }
}
