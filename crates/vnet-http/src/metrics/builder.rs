//! The registry a scrape fills, and the few calls every part of the exposition makes: register
//! a family with its help text and unit, set a labelled value, build the labels of a port.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry, Unit};
use vnet_control::status::PortStatus;

pub(super) type Labels = Vec<(&'static str, String)>;
pub(super) type Counters = Family<Labels, Counter<u64>>;
pub(super) type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;

pub(super) struct Builder {
    pub(super) reg: Registry,
}

// The encoder ends every help text with a period of its own.
pub(super) fn help_text(help: &str) -> &str {
    help.strip_suffix('.').unwrap_or(help)
}

impl Builder {
    pub(super) fn register(&mut self, name: &str, help: &str, unit: Option<Unit>, m: impl Metric) {
        let help = help_text(help);
        match unit {
            Some(u) => self.reg.register_with_unit(name, help, u, m),
            None => self.reg.register(name, help, m),
        }
    }

    pub(super) fn counter(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Counters {
        let f = Counters::default();
        self.register(name, help, unit, f.clone());
        f
    }

    pub(super) fn gauge(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Gauges {
        let f = Gauges::default();
        self.register(name, help, unit, f.clone());
        f
    }

    /// A counter without labels.
    pub(super) fn counter1(&mut self, name: &str, help: &str, unit: Option<Unit>, v: u64) {
        let c: Counter<u64> = Counter::default();
        c.inc_by(v);
        self.register(name, help, unit, c);
    }

    /// A gauge without labels.
    pub(super) fn gauge1(&mut self, name: &str, help: &str, unit: Option<Unit>, v: f64) {
        let g: Gauge<f64, AtomicU64> = Gauge::default();
        g.set(v);
        self.register(name, help, unit, g);
    }
}

pub(super) fn set(f: &Counters, labels: Labels, v: u64) {
    f.get_or_create(&labels).inc_by(v);
}

pub(super) fn gset(f: &Gauges, labels: Labels, v: f64) {
    f.get_or_create(&labels).set(v);
}

pub(super) fn port_labels(p: &PortStatus) -> Labels {
    vec![
        ("role", p.kind.as_str().to_string()),
        ("port", p.name.clone()),
        ("vni", p.vni.to_string()),
    ]
}

pub(super) fn with(mut l: Labels, k: &'static str, v: impl Into<String>) -> Labels {
    l.push((k, v.into()));
    l
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
            .map(|(name, help, unit, _)| b.counter(name, help, unit.clone()))
            .collect();
        FieldCounters { fields, families }
    }

    /// Sets every family, under `labels`, to its field of `v`.
    pub(super) fn set(&self, labels: &Labels, v: &T) {
        for ((_, _, _, field), f) in self.fields.iter().zip(&self.families) {
            set(f, labels.clone(), field(v));
        }
    }
}
