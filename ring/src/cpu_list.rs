//! CPU lists such as `1,3,5-7`, as `--cpus` takes them.

/// A list of CPU numbers, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

/// Parses `1,3,5-7` into `[1, 3, 5, 6, 7]`.
pub fn parse_cpu_list(text: &str) -> Result<CpuList, String> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim) {
        let bad = || format!("expected CPU numbers such as `1,3` or `2-5`, not {part:?}");
        match part.split_once('-') {
            Some((first, last)) => {
                let first: usize = first.trim().parse().map_err(|_| bad())?;
                let last: usize = last.trim().parse().map_err(|_| bad())?;
                if first > last || last - first > 4096 {
                    return Err(bad());
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    let mut seen = cpus.clone();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != cpus.len() {
        return Err(format!("CPU list {text:?} names a CPU twice"));
    }
    Ok(CpuList(cpus))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("1").unwrap().0, vec![1]);
        assert_eq!(parse_cpu_list("1,3,5-7").unwrap().0, vec![1, 3, 5, 6, 7]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("1,1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("").is_err());
    }
}
