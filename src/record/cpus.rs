//! CPU lists: the online CPUs as the kernel lists them, `-C` lists read and checked
//! against them, and the list form the summary and the profile show.

/// Where the kernel lists the online CPUs ("0-3,5").
const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// The CPUs of a list in the kernel's form ("0-3,5": as sysfs writes it and `-C` takes
/// it), sorted, each once; the error names the part that is no CPU number or range.
fn cpu_ranges(list: &str) -> std::result::Result<Vec<i32>, String> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let bounds: Vec<&str> = part.trim().splitn(2, '-').collect();
        let number = |t: &str| {
            t.trim()
                .parse::<i32>()
                .map_err(|_| format!("`{part}` is not a CPU number or range (like 0,2-3)"))
        };
        let (a, b) = match bounds[..] {
            [a] => (number(a)?, number(a)?),
            [a, b] => (number(a)?, number(b)?),
            _ => unreachable!("splitn(2) gives one or two parts"),
        };
        if a > b {
            return Err(format!("the range `{part}` is backwards"));
        }
        cpus.extend(a..=b);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The CPUs that are online (`ONLINE_CPUS`); where it cannot be read, as many as the
/// machine has, from 0.
pub fn online_cpus() -> Vec<i32> {
    let text = std::fs::read_to_string(ONLINE_CPUS).unwrap_or_default();
    match cpu_ranges(text.trim()) {
        Ok(cpus) if !cpus.is_empty() => cpus,
        _ => {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n as i32).collect()
        }
    }
}

/// CPUs as a list ("0,2,3"), as the summary and the profile's command line show them.
pub fn cpu_list_text(cpus: &[i32]) -> String {
    let list: Vec<String> = cpus.iter().map(i32::to_string).collect();
    list.join(",")
}

/// The CPUs of a `-C` list ("0,2-3"), checked against the online ones; the error says
/// what is wrong with the list.
pub fn parse_cpu_list(list: &str) -> std::result::Result<Vec<i32>, String> {
    let cpus = cpu_ranges(list)?;
    let online = online_cpus();
    match cpus.iter().find(|c| !online.contains(c)) {
        Some(cpu) => Err(format!(
            "CPU {cpu} is not online (online: {})",
            std::fs::read_to_string(ONLINE_CPUS)
                .unwrap_or_default()
                .trim()
        )),
        None => Ok(cpus),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_in_the_kernels_form() {
        assert_eq!(cpu_ranges("0-3,5"), Ok(vec![0, 1, 2, 3, 5]));
        assert_eq!(cpu_ranges("2,0-1,1"), Ok(vec![0, 1, 2]));
        assert_eq!(cpu_ranges("0"), Ok(vec![0]));
        assert!(cpu_ranges("3-1").unwrap_err().contains("backwards"));
        assert!(cpu_ranges("0,x").unwrap_err().contains("`x` is not a CPU"));
        assert!(cpu_ranges("").is_err());
        assert!(!online_cpus().is_empty());
    }
}
