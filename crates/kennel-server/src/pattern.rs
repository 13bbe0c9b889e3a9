//! Regular expressions for the OpenAPI document: each states exactly the strings the server
//! accepts for a field, bounds included, so that a client (or a fuzzer) that follows the
//! document is never refused and one that does not is never served.
//!
//! They are ECMA-262 and Python `re` alike (the document's readers use both).

/// A string without NUL bytes: what the sandbox can put into an argv, an environment or a
/// path.
pub const NO_NUL: &str = "^[^\\u0000]*$";

/// An environment variable name: not empty, no `=` and no NUL.
pub const ENV_KEY: &str = "^[^=\\u0000]+$";

/// One path segment that is neither `.` nor `..`, of at most 255 characters (the kernel's
/// NAME_MAX counts bytes, which a pattern cannot: see `kennel_types::api::in_scratch`).
const SEGMENT: &str = "(?:[^/.\\u0000][^/\\u0000]{0,254}|\\.[^/.\\u0000][^/\\u0000]{0,253}\
                       |\\.\\.[^/\\u0000]{1,253})";

/// A file path under `/workspace/` or `/tmp/`, as `in_scratch` accepts it.
pub fn scratch_path() -> String {
    format!("^/(?:workspace|tmp)/{SEGMENT}(?:/{SEGMENT})*$")
}

/// A directory to list: `/workspace`, `/tmp` or a path under either.
pub fn scratch_dir() -> String {
    format!("^/(?:workspace|tmp)(?:/{SEGMENT}(?:/{SEGMENT})*)?$")
}

/// The `{path}` of `/v1/sessions/{id}/files/{path}`: a scratch path whose leading `/` is
/// optional (the URL supplies one).
pub fn scratch_path_param() -> String {
    format!("^/*(?:workspace|tmp)/{SEGMENT}(?:/{SEGMENT})*$")
}

const LABEL: &str = "[A-Za-z0-9-]{1,63}";

/// A network allow rule (`net::Rule::parse`): a domain with a dot (or `localhost`), at most
/// 253 characters, not all digits and dots (an address), with an optional `*.` and ports.
pub fn host_rule() -> String {
    let port = int_range(1, 65535);
    format!(
        "^(?:\\*\\.)?(?=[^:]{{1,253}}(?::|$))(?=[^:]*[A-Za-z-])\
         (?:{LABEL}(?:\\.{LABEL})+|[lL][oO][cC][aA][lL][hH][oO][sS][tT])\
         (?::{port}(?:,{port})*)?$"
    )
}

/// A resolver pin (`net::parse_pins`): `NAME:IP`, the address optionally in brackets.
pub fn pin() -> String {
    let octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    let v4 = format!("{octet}(?:\\.{octet}){{3}}");
    let h = "[0-9A-Fa-f]{1,4}";
    // Every way of writing eight groups, with `::` standing for one or more zero groups and
    // an IPv4 address for the last two.
    let v6 = format!(
        "(?:(?:{h}:){{7}}{h}|(?:{h}:){{6}}{v4}\
         |(?:{h}:){{1,7}}:|(?:{h}:){{1,6}}:{h}|(?:{h}:){{1,5}}(?::{h}){{1,2}}\
         |(?:{h}:){{1,4}}(?::{h}){{1,3}}|(?:{h}:){{1,3}}(?::{h}){{1,4}}\
         |(?:{h}:){{1,2}}(?::{h}){{1,5}}|{h}:(?::{h}){{1,6}}|:(?:(?::{h}){{1,7}}|:)\
         |(?:{h}:){{1,5}}:{v4}|(?:{h}:){{1,4}}:{h}:{v4}|(?:{h}:){{1,3}}:(?:{h}:){{1,2}}{v4}\
         |(?:{h}:){{1,2}}:(?:{h}:){{1,3}}{v4}|{h}::(?:{h}:){{1,4}}{v4}|::(?:{h}:){{0,5}}{v4})"
    );
    format!("^{LABEL}(?:\\.{LABEL})*:(?:{v4}|{v6}|\\[(?:{v4}|{v6})\\])$")
}

/// A resolver pin whose address the server refuses without `allow_pins_to`: one that
/// `net::forbidden` calls loopback, private, link-local, CGNAT, unspecified, multicast,
/// reserved or special-purpose. Matched against a string [`pin`] already accepts, so it only
/// tells addresses apart; IPv6 forms with leading zero groups are matched as the kernel's
/// classification reads them (`::1`, `::`, `::ffff:` + an IPv4 address).
pub fn internal_pin() -> String {
    let hex = "[0-9a-fA-F]";
    // The first two octets of an internal IPv4 address, dotted (a prefix is enough: the
    // whole address is valid already).
    let v4 = "(?:127|10|0|22[4-9]|2[3-4][0-9]|25[0-5])\\.\
              |172\\.(?:1[6-9]|2[0-9]|3[01])\\.|192\\.168\\.|169\\.254\\.\
              |100\\.(?:6[4-9]|[7-9][0-9]|1[01][0-9]|12[0-7])\\.|192\\.0\\.0\\.|198\\.1[89]\\.";
    // The same, as the two hex groups of a mapped address (`::ffff:7f00:1`).
    let v4_hex = format!(
        "(?:(?:7[fF]{hex}{{2}}|0?[aA]{hex}{{2}}|0{{0,2}}{hex}{{1,2}}|[aA][cC]1{hex}|[cC]0[aA]8\
         |[aA]9[fF][eE]|64[4-7]{hex}|[e-fE-F]{hex}{{3}}|[cC]61[23]):{hex}{{1,4}}\
         |[cC]0{{3}}:0{{0,2}}{hex}{{1,2}})\\]?$"
    );
    // Zero groups and colons only: `::1`, `::`, and the prefix of `::ffff:` + IPv4 (whose two
    // last groups are anchored, so that `0:0:0:0:ffff:1:2:3` is not taken for one).
    let zeros = "(?:(?:0{1,4})?:)+";
    let v6 = format!(
        "{zeros}0{{0,3}}1\\]?$|{zeros}(?:0{{1,4}})?\\]?$\
         |{zeros}[fF]{{4}}:(?:{v4}|{v4_hex})\
         |[fF][cCdD]{hex}{{2}}:|[fF][eE][89a-fA-F]{hex}:|[fF]{{2}}{hex}{{2}}:|0{{0,2}}64:[fF]{{2}}9[bB]:"
    );
    format!("^[^:]+:\\[?(?:{v4}|{v6})")
}

/// A `Span` (see `policy::Span`) from `lo_ms` to `hi_ms` milliseconds, both included.
pub fn span(lo_ms: u64, hi_ms: u64) -> String {
    let mut alts = Vec::new();
    let whole = |unit: u64| (lo_ms.div_ceil(unit), hi_ms / unit);
    let (a, b) = whole(1000);
    push_range(&mut alts, a, b, "s?");
    alts.extend(fractional_seconds(lo_ms, hi_ms));
    push_range(&mut alts, lo_ms, hi_ms, "ms");
    let (a, b) = whole(60_000);
    push_range(&mut alts, a, b, "(?:m|min)");
    let (a, b) = whole(3_600_000);
    push_range(&mut alts, a, b, "h");
    anchored(&alts)
}

/// A `ByteSize` from `lo` to `hi` bytes, both included, in any unit that lands inside.
pub fn size(lo: u64, hi: u64) -> String {
    let mut alts = Vec::new();
    let units = [
        (1u64, "[bB]?"),
        (1 << 10, "[kK](?:[iI]?[bB])?"),
        (1 << 20, "[mM](?:[iI]?[bB])?"),
        (1 << 30, "[gG](?:[iI]?[bB])?"),
    ];
    for (mult, unit) in units {
        push_range(&mut alts, lo.div_ceil(mult), hi / mult, unit);
    }
    anchored(&alts)
}

fn anchored(alts: &[String]) -> String {
    format!("^(?:{})$", alts.join("|"))
}

fn push_range(alts: &mut Vec<String>, lo: u64, hi: u64, suffix: &str) {
    if lo <= hi {
        alts.push(format!("{}{suffix}", int_range(lo, hi)));
    }
}

/// `W.F` or `W.Fs` with one to three fraction digits, from `lo` to `hi` milliseconds.
fn fractional_seconds(lo: u64, hi: u64) -> Vec<String> {
    if lo > hi {
        return vec![];
    }
    let (wl, fl, wh, fh) = (lo / 1000, lo % 1000, hi / 1000, hi % 1000);
    let mut parts = Vec::new();
    let mut add = |w0: u64, w1: u64, f0: u64, f1: u64| {
        if let (true, Some(frac)) = (w0 <= w1, fraction(f0, f1)) {
            parts.push(format!("{}\\.{frac}s?", int_range(w0, w1)));
        }
    };
    if wl == wh {
        add(wl, wl, fl, fh);
    } else {
        add(wl, wl, fl, 999);
        if wl + 1 < wh {
            add(wl + 1, wh - 1, 0, 999);
        }
        add(wh, wh, 0, fh);
    }
    parts
}

/// One to three fraction digits worth `lo` to `hi` thousandths.
fn fraction(lo: u64, hi: u64) -> Option<String> {
    let alts: Vec<String> = (1..=3u32)
        .filter_map(|len| {
            let step = 10u64.pow(3 - len);
            let (a, b) = (lo.div_ceil(step), hi / step);
            (a <= b).then(|| fixed(len, a, b))
        })
        .collect();
    (!alts.is_empty()).then(|| format!("(?:{})", alts.join("|")))
}

/// Decimal integers from `lo` to `hi`, leading zeros allowed (Rust's `u64` parser takes them).
pub fn int_range(lo: u64, hi: u64) -> String {
    let alts: Vec<String> = (1..=20u32)
        .filter_map(|width| {
            let floor = if width == 1 { 0 } else { 10u128.pow(width - 1) };
            let ceil = 10u128.pow(width) - 1;
            let (a, b) = (u128::from(lo).max(floor), u128::from(hi).min(ceil));
            // Both lie between `lo` and `hi`, which are u64s.
            let narrow = |n: u128| u64::try_from(n).unwrap_or(u64::MAX);
            (a <= b).then(|| fixed(width, narrow(a), narrow(b)))
        })
        .collect();
    format!("0*(?:{})", alts.join("|"))
}

/// Strings of exactly `width` digits whose value is from `lo` to `hi`.
fn fixed(width: u32, lo: u64, hi: u64) -> String {
    if width == 0 {
        return String::new();
    }
    let p = 10u64.pow(width - 1);
    let (dl, dh, rl, rh) = (lo / p, hi / p, lo % p, hi % p);
    let rest = width - 1;
    if dl == dh {
        return format!("{dl}{}", group(fixed(rest, rl, rh)));
    }
    let mut alts = Vec::new();
    let full_low = rl == 0;
    let full_high = rh == p - 1;
    if !full_low {
        alts.push(format!("{dl}{}", group(fixed(rest, rl, p - 1))));
    }
    let (a, b) = (dl + u64::from(!full_low), dh - u64::from(!full_high));
    if a <= b {
        let any = if rest == 0 {
            String::new()
        } else {
            format!("[0-9]{{{rest}}}")
        };
        alts.push(format!("{}{any}", digit_class(a, b)));
    }
    if !full_high {
        alts.push(format!("{dh}{}", group(fixed(rest, 0, rh))));
    }
    group(alts.join("|"))
}

fn group(re: String) -> String {
    if re.len() <= 1 || !re.contains('|') {
        re
    } else {
        format!("(?:{re})")
    }
}

fn digit_class(a: u64, b: u64) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("[{a}-{b}]")
    }
}

#[cfg(test)]
mod tests {
    //! Each pattern checked against the parser it describes, over every value near its bounds.
    use super::*;
    use kennel_types::policy::{ByteSize, Span};

    /// A tiny regex check: Rust has no regex crate here, so the patterns are tested through
    /// the parsers' own behaviour by brute force in the integration tests (tests/contract.rs
    /// runs Python's `re`). Here: the integer ranges, by a direct evaluator.
    fn matches_range(lo: u64, hi: u64, n: u64) -> bool {
        // fixed() is exercised through this evaluator of its own alternatives.
        let re = int_range(lo, hi);
        eval(&re, &n.to_string())
    }

    /// Evaluates the subset of regex syntax int_range emits: `0*`, `(?:a|b)`, digits,
    /// `[a-b]` and `[0-9]{n}`.
    fn eval(re: &str, s: &str) -> bool {
        fn alts(re: &str) -> Vec<&str> {
            let (mut depth, mut start, mut out) = (0, 0, vec![]);
            for (i, c) in re.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    '|' if depth == 0 => {
                        out.push(&re[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            out.push(&re[start..]);
            out
        }
        fn seq(re: &str, s: &str) -> Vec<usize> {
            // Returns every length of `s`'s prefix that `re` can match.
            if re.is_empty() {
                return vec![0];
            }
            if let Some(rest) = re.strip_prefix("0*") {
                let zeros = s.len() - s.trim_start_matches('0').len();
                return (0..=zeros)
                    .flat_map(|z| seq(rest, &s[z..]).into_iter().map(move |l| l + z))
                    .collect();
            }
            if let Some(inner) = re.strip_prefix("(?:") {
                let mut depth = 1;
                let end = inner
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '(' => 1,
                            ')' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map(|(i, _)| i)
                    .unwrap();
                let (body, rest) = (&inner[..end], &inner[end + 1..]);
                return alts(body)
                    .into_iter()
                    .flat_map(|a| seq(a, s))
                    .flat_map(|l| seq(rest, &s[l..]).into_iter().map(move |m| l + m))
                    .collect();
            }
            let (class, rest): (Box<dyn Fn(u8) -> bool>, &str) =
                if let Some(r) = re.strip_prefix('[') {
                    let (a, b) = (r.as_bytes()[0], r.as_bytes()[2]);
                    (Box::new(move |c| (a..=b).contains(&c)), &r[4..])
                } else {
                    let d = re.as_bytes()[0];
                    (Box::new(move |c| c == d), &re[1..])
                };
            let (count, rest) = match rest.strip_prefix('{') {
                Some(r) => {
                    let end = r.find('}').unwrap();
                    (r[..end].parse().unwrap(), &r[end + 1..])
                }
                None => (1, rest),
            };
            if s.len() < count || !s.bytes().take(count).all(&class) {
                return vec![];
            }
            seq(rest, &s[count..])
                .into_iter()
                .map(|l| l + count)
                .collect()
        }
        seq(re, s).contains(&s.len())
    }

    #[test]
    fn integer_ranges_hold_exactly_their_values() {
        for (lo, hi) in [
            (0, 0),
            (1, 9),
            (4, 1024),
            (7, 300),
            (1, 65535),
            (99, 1000),
            (8, 8),
        ] {
            for n in 0..=hi + 1200 {
                assert_eq!(
                    matches_range(lo, hi, n),
                    (lo..=hi).contains(&n),
                    "{n} in {lo}..={hi}: {}",
                    int_range(lo, hi)
                );
            }
        }
        assert!(eval(&int_range(4, 1024), "0004"));
    }

    #[test]
    fn spans_and_sizes_name_their_bounds() {
        let s = span(1, 300_000);
        assert!(
            s.contains("ms") && s.starts_with('^') && s.ends_with('$'),
            "{s}"
        );
        assert_eq!("300s".parse::<Span>().unwrap().millis(), 300_000);
        let z = size(8 << 20, 4 << 30);
        assert!(z.contains("[gG]"), "{z}");
        assert_eq!("4G".parse::<ByteSize>().unwrap().0, 4 << 30);
    }
}
