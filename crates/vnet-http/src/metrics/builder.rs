//! The OpenMetrics text a scrape writes, written directly: register a family with its help
//! text, type and unit, set a labelled value, build the labels of a port.
//!
//! Each family keeps its samples as text in the order they were set, and the exposition is the
//! families in the order they were registered, each under its `# HELP`/`# TYPE`/`# UNIT` lines
//! (a family without samples is left out whole), then `# EOF`. A label set is escaped once, when
//! it is built, and copied into every series that carries it. This replaced
//! `prometheus-client`'s registry and encoder, which took a list of label pairs per series
//! (three `String`s cloned for each of a port's 30 series) and wrote them through a chain of
//! `dyn Write` with an escaping check per value: at 1,000 links a scrape cost vnetd 47 ms of
//! CPU with it and costs 7 ms now (with the spare buffers below and the listener writing the
//! body where it is; `docs/design/http.md`). A scrape on a host that a route storm saturates
//! waits for a core (`Source::background`), so its cost is what the scraper waits for. The
//! text is byte for byte what the registry wrote (the golden test).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Mutex;

use vnet_control::status::PortStatus;
use vnet_core::LockRecover;

/// Sample buffers of earlier scrapes, emptied, their capacity kept: a scrape at 1,000 links
/// fills 2 MB of them, and memory fresh from the allocator each time is memory the kernel
/// zeroes page by page (page faults and zeroing were about a fifth of a scrape's CPU in a
/// profile before they were kept). At most `SPARE_BUFFERS` buffers of at most `SPARE_BYTES`
/// each: a scrape has about 100 families, so this keeps two or three scrapes' buffers.
static SPARE: Mutex<Vec<String>> = Mutex::new(Vec::new());
const SPARE_BUFFERS: usize = 256;
const SPARE_BYTES: usize = 16 << 20;

fn spare_buffer() -> String {
    SPARE.lock_or_recover().pop().unwrap_or_default()
}

fn give_back(mut b: String) {
    if b.capacity() > SPARE_BYTES {
        return;
    }
    b.clear();
    let mut spare = SPARE.lock_or_recover();
    if spare.len() < SPARE_BUFFERS {
        spare.push(b);
    }
}

/// A family's unit: a suffix of its name, and its `# UNIT` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unit {
    Bytes,
    Seconds,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Seconds => "seconds",
        }
    }
}

/// A series' label pairs, escaped and joined (`k="v",k2="v2"`), without the braces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Labels(String);

impl Labels {
    /// One pair.
    pub(super) fn of(key: &str, value: &str) -> Labels {
        Labels::default().with(key, value)
    }

    /// These pairs and one more.
    pub(super) fn with(mut self, key: &str, value: &str) -> Labels {
        push_pair(&mut self.0, key, value);
        self
    }
}

/// Appends `key="value"` (after a comma when `out` has pairs), the value escaped as the text
/// format asks: backslash, double quote and line feed.
fn push_pair(out: &mut String, key: &str, value: &str) {
    if !out.is_empty() {
        out.push(',');
    }
    out.push_str(key);
    out.push_str("=\"");
    let mut rest = value;
    while let Some(i) = rest.find(['\\', '"', '\n']) {
        out.push_str(&rest[..i]);
        out.push_str(match rest.as_bytes()[i] {
            b'\\' => "\\\\",
            b'"' => "\\\"",
            _ => "\\n",
        });
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
    out.push('"');
}

/// A value one sample holds, and how it is written.
pub(super) trait SampleValue: Copy {
    const TYPE: &'static str;
    /// The suffix of a sample's name (`_total` for counters).
    const SUFFIX: &'static str;
    fn write(self, out: &mut String);
}

impl SampleValue for u64 {
    const TYPE: &'static str = "counter";
    const SUFFIX: &'static str = "_total";
    fn write(self, out: &mut String) {
        out.push_str(itoa::Buffer::new().format(self));
    }
}

impl SampleValue for f64 {
    const TYPE: &'static str = "gauge";
    const SUFFIX: &'static str = "";
    fn write(self, out: &mut String) {
        out.push_str(dtoa::Buffer::new().format(self));
    }
}

/// One family: its descriptor, and its samples as text.
#[derive(Debug)]
struct FamilyText {
    /// `vnet_` + name + `_` + unit: what `# HELP` names.
    name: String,
    help: String,
    kind: &'static str,
    unit: Option<Unit>,
    samples: String,
}

/// A handle on one family's samples: the builder keeps the family, the scrape sets through
/// this. Single-threaded: a scrape is built on one thread.
#[derive(Debug)]
pub(super) struct Samples<V> {
    family: Rc<RefCell<FamilyText>>,
    _value: std::marker::PhantomData<V>,
}

impl<V> Clone for Samples<V> {
    fn clone(&self) -> Self {
        Samples {
            family: self.family.clone(),
            _value: std::marker::PhantomData,
        }
    }
}

pub(super) type Counters = Samples<u64>;
pub(super) type Gauges = Samples<f64>;

impl<V: SampleValue> Samples<V> {
    /// Sets a series. Each series once per scrape: the list does not merge a label set given
    /// twice (it would be a duplicate series; the tests check that every series is unique).
    pub(super) fn set(&self, labels: &Labels, v: V) {
        self.write(labels, None, v);
    }

    /// Sets the series of `labels` and the pairs of `more` (a label set built once for many
    /// series: a drop reason, a link state).
    pub(super) fn set_with(&self, labels: &Labels, more: &Labels, v: V) {
        self.write(labels, Some(more), v);
    }

    fn write(&self, labels: &Labels, more: Option<&Labels>, v: V) {
        let mut f = self.family.borrow_mut();
        let FamilyText { name, samples, .. } = &mut *f;
        samples.push_str(name);
        samples.push_str(V::SUFFIX);
        let more = more.map_or("", |m| m.0.as_str());
        if !labels.0.is_empty() || !more.is_empty() {
            samples.push('{');
            samples.push_str(&labels.0);
            if !labels.0.is_empty() && !more.is_empty() {
                samples.push(',');
            }
            samples.push_str(more);
            samples.push('}');
        }
        samples.push(' ');
        v.write(samples);
        samples.push('\n');
    }
}

/// The families of one scrape, in the order they were registered.
#[derive(Debug, Default)]
pub(super) struct Builder {
    families: Vec<Rc<RefCell<FamilyText>>>,
}

// Every help text ends with one period, as the registry wrote it.
pub(super) fn help_text(help: &str) -> &str {
    help.strip_suffix('.').unwrap_or(help)
}

impl Builder {
    fn family<V: SampleValue>(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Samples<V> {
        let mut full = String::with_capacity(5 + name.len() + 8);
        full.push_str("vnet_");
        full.push_str(name);
        if let Some(u) = unit {
            full.push('_');
            full.push_str(u.as_str());
        }
        let family = Rc::new(RefCell::new(FamilyText {
            name: full,
            help: format!("{}.", help_text(help)),
            kind: V::TYPE,
            unit,
            samples: spare_buffer(),
        }));
        self.families.push(family.clone());
        Samples {
            family,
            _value: std::marker::PhantomData,
        }
    }

    pub(super) fn counter(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Counters {
        self.family(name, help, unit)
    }

    pub(super) fn gauge(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Gauges {
        self.family(name, help, unit)
    }

    /// A counter without labels.
    pub(super) fn counter1(&mut self, name: &str, help: &str, unit: Option<Unit>, v: u64) {
        self.counter(name, help, unit).set(&Labels::default(), v);
    }

    /// A gauge without labels.
    pub(super) fn gauge1(&mut self, name: &str, help: &str, unit: Option<Unit>, v: f64) {
        self.gauge(name, help, unit).set(&Labels::default(), v);
    }

    /// The exposition: every family with samples, then `# EOF`. Written once into a buffer of
    /// its exact size; the families' buffers go back to the spares.
    pub(super) fn finish(self) -> String {
        // The handles the scrape set through may still be alive: take each family's text.
        let families: Vec<(String, String)> = self
            .families
            .iter()
            .map(|f| {
                let mut f = f.borrow_mut();
                let samples = std::mem::take(&mut f.samples);
                if samples.is_empty() {
                    return (String::new(), samples);
                }
                let mut head = format!(
                    "# HELP {} {}\n# TYPE {} {}\n",
                    f.name, f.help, f.name, f.kind
                );
                if let Some(u) = f.unit {
                    head.push_str(&format!("# UNIT {} {}\n", f.name, u.as_str()));
                }
                (head, samples)
            })
            .collect();
        let size = families
            .iter()
            .map(|(h, s)| h.len() + s.len())
            .sum::<usize>()
            + "# EOF\n".len();
        let mut out = String::with_capacity(size);
        for (head, samples) in families {
            out.push_str(&head);
            out.push_str(&samples);
            give_back(samples);
        }
        out.push_str("# EOF\n");
        out
    }
}

pub(super) fn port_labels(p: &PortStatus) -> Labels {
    Labels::of("role", p.kind.as_str())
        .with("port", &p.name)
        .with("vni", itoa::Buffer::new().format(p.vni))
}

/// A labelled counter family that one field of a status struct `T` fills: name, help text,
/// unit, and the field.
pub(super) type Field<T> = (&'static str, &'static str, Option<Unit>, fn(&T) -> u64);

/// One counter family per field of a table, registered in the table's order and filled from
/// one `T` at a time: the name of each metric stands next to the field it reads.
pub(super) struct FieldCounters<T: 'static> {
    fields: &'static [Field<T>],
    families: Vec<Counters>,
}

impl<T> FieldCounters<T> {
    pub(super) fn new(b: &mut Builder, fields: &'static [Field<T>]) -> Self {
        let families = fields
            .iter()
            .map(|(name, help, unit, _)| b.counter(name, help, *unit))
            .collect();
        FieldCounters { fields, families }
    }

    /// Sets every family, under `labels`, to its field of `v`.
    pub(super) fn set(&self, labels: &Labels, v: &T) {
        for ((_, _, _, field), f) in self.fields.iter().zip(&self.families) {
            f.set(labels, field(v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_keys_joined() {
        let l = Labels::of("a", "x\"y\\z\nw").with("b", "plain");
        assert_eq!(l.0, r#"a="x\"y\\z\nw",b="plain""#);
        assert_eq!(Labels::of("k", "").0, r#"k="""#);
    }

    #[test]
    fn a_family_without_samples_is_left_out_and_units_suffix_names() {
        let mut b = Builder::default();
        let _empty = b.counter("nothing", "Never set.", None);
        let c = b.counter("sent", "Bytes sent", Some(Unit::Bytes));
        c.set(&Labels::of("port", "p"), 7);
        c.set_with(&Labels::of("port", "q"), &Labels::of("why", "x"), 8);
        c.set_with(&Labels::default(), &Labels::of("why", "y"), 9);
        b.gauge1("up", "Up.", None, 1.0);
        assert_eq!(
            b.finish(),
            "# HELP vnet_sent_bytes Bytes sent.\n\
             # TYPE vnet_sent_bytes counter\n\
             # UNIT vnet_sent_bytes bytes\n\
             vnet_sent_bytes_total{port=\"p\"} 7\n\
             vnet_sent_bytes_total{port=\"q\",why=\"x\"} 8\n\
             vnet_sent_bytes_total{why=\"y\"} 9\n\
             # HELP vnet_up Up.\n\
             # TYPE vnet_up gauge\n\
             vnet_up 1.0\n\
             # EOF\n"
        );
    }
}
