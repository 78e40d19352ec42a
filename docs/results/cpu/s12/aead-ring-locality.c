/* Session 12 probe: sealing 1448-byte datagrams from a cold 1 GiB source into rings of 256..32768
 * 2048-byte slots, against in place in one hot buffer.
 * gcc -O2 aead-ring-locality.c -o /tmp/aead-ring -lcrypto && /tmp/aead-ring */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint8_t hdr[24], key[32], iv[12];
#define SZ 1448
int main(int argc,char**argv){
  size_t srclen=(size_t)1<<30; uint8_t *src=malloc(srclen); memset(src,1,srclen);
  EVP_CIPHER_CTX *c=EVP_CIPHER_CTX_new(); int outl;
  EVP_EncryptInit_ex(c,EVP_aes_256_gcm(),NULL,NULL,NULL);
  EVP_CIPHER_CTX_ctrl(c,EVP_CTRL_AEAD_SET_IVLEN,12,NULL);
  EVP_EncryptInit_ex(c,NULL,NULL,key,NULL);
  size_t rings[]={0, 256, 1024, 4096, 32768}; /* slots of 2048; 0 = in place, hot */
  for(int rep=0;rep<2;rep++) for(int k=0;k<5;k++){
    size_t cap=rings[k]; uint8_t *ring=malloc((cap?cap:1)*2048); memset(ring,0,(cap?cap:1)*2048);
    size_t n=srclen/SZ; double t=now(); static uint8_t hot[2048];
    for(size_t i=0;i<n;i++){ uint8_t *in = cap? src+i*SZ : hot; uint8_t *out= cap? ring+(i%cap)*2048 : hot;
      iv[11]=i; EVP_EncryptInit_ex(c,NULL,NULL,NULL,iv); EVP_EncryptUpdate(c,NULL,&outl,hdr,24);
      EVP_EncryptUpdate(c,out+40,&outl,in,SZ); EVP_EncryptFinal_ex(c,out+40+SZ,&outl); EVP_CIPHER_CTX_ctrl(c,EVP_CTRL_AEAD_GET_TAG,16,out+40+SZ);}
    double e=now()-t; printf("ring %6zu slots (%6zu KB): %.3f CPU-s/GB\n",cap,cap*2,e/(n*(double)SZ)*1e9); free(ring);}
}
