//! Alibaba GPU trace v2023 ("openb") CSV parsing.
