//! virtplug's controller crate. Implemented so far: [`migrate`], the move of VMI-only hot-plugged
//! volumes into VM specs before declarative hot-plug is turned on. VM lifecycle, declarative
//! hot-plug, the legacy volume requests and local storage come with the controller issue.

pub mod hotplug;
pub mod migrate;
pub mod run;
