//! virtplug's Redfish service: one BMC per VirtualMachine, so that bare-metal provisioning
//! (OpenStack Ironic, metal3, anything that speaks DMTF Redfish) drives a VM like a rack
//! server. A Kubernetes client like the controller: it reads VMs, VMIs and its account Secrets
//! through watch-backed caches and writes through the API (never the store).
//!
//! - [`service`]: state, start, router; [`handler`]: every request's path;
//!   [`protocol`]: headers, ETags, query parameters; [`error`] and [`registry`]: Redfish error
//!   bodies with Base registry messages;
//! - [`uri`]: the typed URIs; [`resources`]: one file per resource;
//! - [`actions`] parses every write into a typed action, [`executor`] carries it out ([`reset`]
//!   for power, [`media`] for virtual media, [`boot`] for the boot override and mode);
//! - [`auth`], [`sessions`], [`accounts`]: who may do what, and seeing which VMs;
//! - [`cache`], [`tasks`], [`power`], [`settings`], [`metrics`].

pub mod accounts;
pub mod actions;
pub mod auth;
pub mod boot;
pub mod cache;
pub mod error;
pub mod executor;
pub mod follow;
pub mod handler;
pub mod media;
pub mod metrics;
pub mod power;
pub mod protocol;
pub mod registry;
pub mod reset;
pub mod resources;
pub mod service;
pub mod sessions;
pub mod settings;
pub mod tasks;
pub mod uri;

pub use service::{router, Service, StartError, Started};
