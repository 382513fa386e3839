//! Namespaces through [`CoordClient`]: declare, delete, list (`coord.admin.Namespaces`).

use coord_proto::coord::admin::namespaces_client::NamespacesClient;
use coord_proto::coord::admin::{
    DeclareNamespaceReply, DeclareNamespaceRequest, DeleteNamespaceRequest, ListNamespacesRequest,
    NamespaceRow,
};
use tonic::Status;

use super::CoordClient;

impl CoordClient {
    /// Creates namespace `req.name`, or confirms it exists with this shape and these limits.
    pub async fn declare_namespace(
        &self,
        req: DeclareNamespaceRequest,
    ) -> Result<DeclareNamespaceReply, Status> {
        self.mutate(req, |ch, r| async move {
            NamespacesClient::new(ch).declare(r).await
        })
        .await
    }

    /// Deletes namespace `name` and everything in it.
    pub async fn delete_namespace(&self, name: &str) -> Result<(), Status> {
        let req = DeleteNamespaceRequest {
            name: name.to_string(),
        };
        self.mutate(req, |ch, r| async move {
            NamespacesClient::new(ch).delete(r).await
        })
        .await
        .map(|_| ())
    }

    /// Every namespace with its usage, the default one first.
    pub async fn list_namespaces(&self) -> Result<Vec<NamespaceRow>, Status> {
        self.call(ListNamespacesRequest {}, None, |ch, r| async move {
            NamespacesClient::new(ch).list(r).await
        })
        .await
        .map(|r| r.namespaces)
    }
}
