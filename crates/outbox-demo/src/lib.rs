#![doc = include_str!("../README.md")]

pub mod domain;
pub mod scenario;
