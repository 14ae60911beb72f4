pub mod apiserver;
pub mod nodes;
pub mod rest;
