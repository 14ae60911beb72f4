pub mod apiserver;
pub mod nodes;
