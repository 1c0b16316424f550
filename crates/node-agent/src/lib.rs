pub mod api {
    tonic::include_proto!("v1beta1");
}
