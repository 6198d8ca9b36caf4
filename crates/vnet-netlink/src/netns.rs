//! Running a job inside another network namespace: namespace membership is per thread, so a
//! short-lived thread joins it (`setns`), runs the job and ends.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Runs `job` on a thread that has joined namespace `ns` (an open `/run/netns/NAME` or
/// `/proc/PID/ns/net`), and returns its result.
pub fn in_netns<T: Send + 'static>(
    ns: &File,
    job: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let ns = ns.try_clone()?;
    std::thread::spawn(move || {
        // SAFETY: setns on a namespace file we hold open; it affects only this thread, which
        // ends right after the job.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        job()
    })
    .join()
    .map_err(|_| io::Error::other("namespace job panicked"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_runs_in_the_namespace_and_its_result_comes_back() {
        // Our own namespace. setns needs CAP_SYS_ADMIN: with it the job runs; without, the
        // error comes back.
        let ns = File::open("/proc/self/ns/net").expect("own namespace");
        match in_netns(&ns, || Ok(7)) {
            Ok(v) => assert_eq!(v, 7),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}"),
        }
        let failed: io::Result<()> = in_netns(&ns, || Err(io::Error::other("job failed")));
        assert!(failed.is_err());
    }
}
