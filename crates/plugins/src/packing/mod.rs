//! Packing policies (the `Packer` extension point).
