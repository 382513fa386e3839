//! The open files limit of a process that holds a connection per rank or per task.
//!
//! A process commonly starts with a soft limit of 1,024 open files, while its hard limit (what the
//! host allows it) is far higher. coord-proxy in front of a whole job's torch ranks holds one
//! connection per rank (100,000 in a large job's `init_process_group`), and so does the benchmark
//! that simulates them: each takes its hard limit, as most servers do.

fn read() -> std::io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the rlimit this function owns.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit)
}

/// This process's soft limit of open files: how many descriptors it may hold now.
pub fn limit() -> std::io::Result<u64> {
    Ok(read()?.rlim_cur)
}

/// Raises this process's soft limit of open files to its hard limit: the limits before and
/// after, or `None` when it already was there.
pub fn raise_to_hard_limit() -> std::io::Result<Option<(u64, u64)>> {
    let mut limit = read()?;
    if limit.rlim_cur >= limit.rlim_max {
        return Ok(None);
    }
    let soft = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit only reads the rlimit this function owns.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Some((soft, limit.rlim_max)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        super::raise_to_hard_limit().expect("raised");
        assert_eq!(super::raise_to_hard_limit().expect("read"), None);
        let hard = super::read().expect("read").rlim_max;
        assert_eq!(super::limit().expect("read"), hard);
    }
}
