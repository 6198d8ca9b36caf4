//! `set SETTING VALUE`: the data path's tunables, each with its range.

use super::words::{err, keyword, number, on_off, unknown, Words};
use crate::command::{ParseError, Setting, MAX_CPU};

pub(super) fn parse_setting(w: &mut Words) -> Result<Setting, ParseError> {
    const SETTINGS: &str = "learn, mode, dispatchers, yield, yield-sleep-us, yield-nowork-us, adaptive-low, adaptive-high, adaptive-window-ms, cpus, cut-through, notify, notify-alpha-mbps, notify-beta-mbps, fastpath";
    let s = match w.next("setting")? {
        "learn" => Setting::Learn(on_off(w.next("on or off")?)?),
        "mode" => Setting::Mode(keyword(w.next("mode")?, "mode")?),
        "dispatchers" => Setting::Dispatchers(number(w.next("count")?, "dispatcher count", 1, 64)?),
        "yield" => Setting::Yield(keyword(w.next("yield strategy")?, "yield strategy")?),
        "yield-sleep-us" => {
            Setting::YieldSleepUs(number(w.next("microseconds")?, "T_sleep", 1, 1_000_000)?)
        }
        "yield-nowork-us" => {
            Setting::YieldNoworkUs(number(w.next("microseconds")?, "T_nowork", 1, 10_000_000)?)
        }
        "adaptive-low" => Setting::AdaptiveLow(number(
            w.next("packets per second")?,
            "alpha_l",
            1,
            100_000_000,
        )?),
        "adaptive-high" => Setting::AdaptiveHigh(number(
            w.next("packets per second")?,
            "alpha_u",
            1,
            100_000_000,
        )?),
        "adaptive-window-ms" => {
            Setting::AdaptiveWindowMs(number(w.next("milliseconds")?, "window", 1, 10_000)?)
        }
        "cpus" => {
            let v = w.next("CPU list or none")?;
            if v == "none" {
                Setting::Cpus(vec![])
            } else {
                let mut cpus = Vec::new();
                for c in v.split(',') {
                    cpus.push(number(c, "CPU number", 0, MAX_CPU)?);
                }
                if cpus.len() > 64 {
                    return err("at most 64 CPUs in the list");
                }
                Setting::Cpus(cpus)
            }
        }
        "cut-through" => Setting::CutThrough(on_off(w.next("on or off")?)?),
        "notify" => Setting::Notify(keyword(
            w.next("notification policy")?,
            "notification policy",
        )?),
        "notify-alpha-mbps" => {
            Setting::NotifyAlphaMbps(number(w.next("Mbit/s")?, "alpha", 0, 1_000_000)?)
        }
        "notify-beta-mbps" => {
            Setting::NotifyBetaMbps(number(w.next("Mbit/s")?, "beta", 1, 1_000_000)?)
        }
        "fastpath" => Setting::FastPath(keyword(w.next("kernel or off")?, "fast path")?),
        o => return unknown("setting", o, SETTINGS),
    };
    Ok(s)
}
