//! Logging: `tracing` to stderr and to a daily log file in the data dir. Never to stdout (the ACP channel).

use std::path::Path;

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the global subscriber: `stderr_filter` and `file_filter` apply when `RUST_LOG` is unset (which then
/// sets both). `for_person` writes short lines on stderr (no time, no module), for the terminal commands. Keep
/// the returned guard alive: it flushes the file on exit.
pub fn init(log_file: &Path, stderr_filter: &str, file_filter: &str, for_person: bool) -> Option<WorkerGuard> {
    let filter = |default: &str| EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(false);
    let stderr = match for_person {
        true => stderr.without_time().with_target(false).with_filter(filter(stderr_filter)).boxed(),
        false => stderr.with_filter(filter(stderr_filter)).boxed(),
    };
    let file = log_file.parent().and_then(|dir| {
        crate::paths::create_private_dir(dir).ok()?;
        let name = log_file.file_name()?.to_str()?;
        // One file a day, a week of them: an agent server runs for months.
        let appender = tracing_appender::rolling::RollingFileAppender::builder()
            .rotation(tracing_appender::rolling::Rotation::DAILY)
            .filename_prefix(name)
            .max_log_files(7)
            .build(dir)
            .ok()?;
        Some(tracing_appender::non_blocking(appender))
    });
    match file {
        Some((writer, guard)) => {
            let file_layer =
                tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(false).with_filter(filter(file_filter));
            let _ = tracing_subscriber::registry().with(stderr).with(file_layer).try_init();
            Some(guard)
        }
        None => {
            let _ = tracing_subscriber::registry().with(stderr).try_init();
            None
        }
    }
}

use tracing_subscriber::Layer as _;
