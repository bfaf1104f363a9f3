//! Who a commit is by (a leaf: the configuration names one too).

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub name: String,
    pub email: String,
}
